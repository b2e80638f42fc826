"""Who may talk to the gateway (design §7, security): the rules every request passes, in
this order, before any route runs.

1. ``Host`` must name this server (``--allowed-hosts``; loopback names and ``--host`` by
   default): a DNS-rebinding page cannot reach a gateway on 127.0.0.1 — 400 otherwise.
2. A request carrying ``Origin`` (a browser) must come from this server's own origin
   (scheme, host and port of the request's ``Host``) or one of ``--allowed-origins``: a
   web page of another origin, another port of the same host included, cannot create
   sessions or post turns — 403 otherwise. Independent of rule 1 (``--allowed-hosts '*'``
   keeps it); ``--allowed-origins '*'`` turns it off.
3. With ``--api-key`` (or ``TITO_API_KEY``), every route but ``GET /health`` needs
   ``Authorization: Bearer KEY`` (or Anthropic's ``x-api-key: KEY``) — 401 otherwise; a
   GET/HEAD to the viewer (``/ui``) may carry it in the ``tito_api_key`` cookie instead
   (:mod:`tito.server.ui.login`).
4. A request body must be JSON: a non-empty body whose ``content-type`` is not
   ``application/json`` (or ``+json``) is 415, so a cross-site ``text/plain`` form post
   never reaches a route (an empty body may carry any type: some clients label it).

:class:`AccessRules` only decides; :mod:`tito.server.entry` answers a refusal.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import Scope

from tito.config import ServerConfig
from tito.server.ui import login
from tito.types.errors import (
    BadRequest,
    Forbidden,
    TitoError,
    Unauthorized,
    UnsupportedMediaType,
)
from tito.types.origins import origin_set, parse_origin

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_OPEN_PATHS = frozenset({"/health"})


def allowed_host_names(configured: Iterable[str] | None, bind_host: str) -> frozenset[str]:
    """``--allowed-hosts`` as a set (``*`` allows any); default: loopback + ``--host``."""
    if configured is not None:
        return frozenset(h.strip().lower() for h in configured if h.strip())
    names = set(LOOPBACK_HOSTS)
    if bind_host not in ("", "0.0.0.0", "::"):
        names.add(bind_host.lower())
    return frozenset(names)


class OriginRule:
    """Rule 2: the ``Origin`` of a browser's request must be the request's own (the
    scheme it came in with, the host and port of its ``Host`` header) or a listed one."""

    def __init__(self, configured: Iterable[str] | None = None) -> None:
        self.listed = origin_set(configured)

    def allows(self, origin: bytes, host: bytes, scheme: str) -> bool:
        if self.listed is None:
            return True
        theirs = parse_origin(origin.decode("latin-1"))
        if theirs is None:
            return False
        own = parse_origin(f"{scheme}://{host.decode('latin-1')}")  # passed rule 1
        return theirs == own or theirs in self.listed

    @staticmethod
    def refused() -> Forbidden:
        return Forbidden("cross-origin requests are refused (the Origin header names "
                         "another site, or another port; --allowed-origins lists others)",
                         code="cross_origin")


def _has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length")
    if length is not None:
        return length.strip() not in (b"0", b"")
    return b"transfer-encoding" in headers


def _host_name(value: str) -> str:
    """``example.org:8000`` -> ``example.org``; ``[::1]:8000`` -> ``::1``."""
    return urlsplit("//" + value).hostname or ""


class AccessRules:
    """The four rules of one gateway (its ``--allowed-hosts``, ``--host``,
    ``--allowed-origins`` and ``--api-key``)."""

    def __init__(self, config: ServerConfig) -> None:
        self.hosts = allowed_host_names(config.allowed_hosts, config.host)
        self.any_host = "*" in self.hosts
        self.origins = OriginRule(config.allowed_origins)
        self.key = f"Bearer {config.api_key}".encode() if config.api_key else None
        self.raw_key = config.api_key.encode() if config.api_key else None
        self._host_allowed: dict[bytes, bool] = {}
        """``Host`` header -> allowed (a client sends the same one every time)."""

    def _allowed_host(self, host: bytes) -> bool:
        allowed = self._host_allowed.get(host)
        if allowed is None:
            allowed = _host_name(host.decode("latin-1")) in self.hosts
            if len(self._host_allowed) >= 256:  # bounded: Host is the client's to choose
                self._host_allowed.clear()
            self._host_allowed[host] = allowed
        return allowed

    def refusal(self, scope: Scope) -> TitoError | None:
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"")
        if not self.any_host and not self._allowed_host(host):
            return BadRequest(f"host {host.decode('latin-1')!r} is not allowed "
                              "(--allowed-hosts)", code="host_not_allowed")
        origin = headers.get(b"origin")
        if origin is not None and not self.origins.allows(origin, host,
                                                              scope.get("scheme", "http")):
            return self.origins.refused()
        if self.key is not None and scope["path"] not in _OPEN_PATHS and \
                not self._authorized(scope, headers):
            return Unauthorized("missing or wrong API key: send 'Authorization: Bearer KEY' "
                                "(the gateway runs with --api-key)")
        content_type = headers.get(b"content-type")
        if content_type is not None and scope["method"] in _BODY_METHODS and \
                _has_body(headers):
            media = content_type.split(b";", 1)[0].strip().lower()
            if media != b"application/json" and not media.endswith(b"+json"):
                return UnsupportedMediaType(
                    f"request bodies must be JSON (content-type application/json), got "
                    f"{content_type.decode('latin-1')!r}")
        return None

    def _authorized(self, scope: Scope, headers: dict[bytes, bytes]) -> bool:
        assert self.key is not None and self.raw_key is not None
        bearer = headers.get(b"authorization")
        if bearer is not None and hmac.compare_digest(bearer, self.key):
            return True
        api_key = headers.get(b"x-api-key") or login.cookie_key(scope, headers)
        return api_key is not None and hmac.compare_digest(api_key, self.raw_key)
