"""Web origins (RFC 6454): ``scheme://host[:port]``, compared as (scheme, host, port).

Two origins are the same only when all three agree: ``http://localhost:3000`` is not
``http://localhost:8000``, and an absent port is the scheme's default (80, 443).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]
"""(scheme, lower-case host, port) of a web origin."""


def parse_origin(value: str) -> Origin | None:
    """``http(s)://host[:port]`` as an :data:`Origin`; None when ``value`` is not one
    (``null``, another scheme, a path, userinfo, a bad port)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:  # a port out of range or not a number
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.path or parts.query \
            or parts.fragment or "@" in parts.netloc:
        return None
    return scheme, parts.hostname.lower(), DEFAULT_PORTS[scheme] if port is None else port


def bad_origin(configured: Iterable[str] | None) -> str | None:
    """The first entry of an origin list that is neither ``*`` nor an origin (a trailing
    ``/`` is allowed); None when all are fine."""
    for entry in configured or ():
        text = entry.strip()
        if text != "*" and parse_origin(text.removesuffix("/")) is None:
            return entry
    return None


def origin_set(configured: Iterable[str] | None) -> frozenset[Origin] | None:
    """An origin list as a set (None: it has ``*``, any origin); entries that are not
    origins are skipped (:func:`bad_origin` reports them)."""
    origins: set[Origin] = set()
    for entry in configured or ():
        text = entry.strip()
        if text == "*":
            return None
        origin = parse_origin(text.removesuffix("/"))
        if origin is not None:
            origins.add(origin)
    return frozenset(origins)
