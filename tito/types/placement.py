"""Which gateway worker holds a session (``tito serve --workers N``).

Workers are independent gateway processes on consecutive ports. A session id made by
worker ``i`` of several ends with ``i`` as two hex digits, so a client that knows the
workers' URLs finds a session's gateway from its id alone (:func:`gateway_of`); new
sessions are placed by a stable hash of a key the client chooses, e.g. the trajectory's
index (:func:`gateway_for`), so a re-run places them alike.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence

MAX_WORKERS = 256
"""Worker indices fit in the id's last two hex digits."""


def new_session_id(worker: int | None) -> str:
    """32 hex digits; the last two are ``worker`` when the gateway is one of several."""
    raw = uuid.uuid4().hex
    return raw if worker is None else raw[:30] + f"{worker:02x}"


def worker_of(session_id: str) -> int | None:
    """The worker index a session id names (None: not a 32-hex-digit id)."""
    if len(session_id) != 32:
        return None
    try:
        return int(session_id[-2:], 16)
    except ValueError:
        return None


def gateway_for(key: object, urls: Sequence[str]) -> str:
    """The gateway for a new session keyed ``key`` (the same key, the same gateway)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return urls[int.from_bytes(digest, "big") % len(urls)]


def gateway_of(session_id: str, urls: Sequence[str]) -> str:
    """The gateway holding ``session_id`` among the workers ``urls`` (in worker order)."""
    index = worker_of(session_id)
    if len(urls) == 1 or index is None or index >= len(urls):
        return urls[0]
    return urls[index]


def session_of(rid: str) -> str:
    """The session of an engine request id (``<session>_t<turn>_<hex>``, as the gateway
    names them); a foreign id is its own session. Engines route on it (SGLang's router:
    ``X-SMG-Routing-Key``; the engine pool: stickiness)."""
    session, sep, _ = rid.partition("_t")
    return session if sep else rid
