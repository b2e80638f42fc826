"""The stale keep-alive retry of the client library (the client side of the rule the
gateway's engine transport follows, :mod:`tito.engines.transport`).

A pooled connection the server closes as idle at the moment the client reuses it fails
the request before the server read it: the request was never run. Such a request is sent
again, at most :data:`MAX_STALE_RETRIES` times, each time on whatever connection the pool
gives (a closed one is dropped from the pool). Exactly these are resent: a transport
error (reset, broken pipe, "Server disconnected without sending a response") on a
*reused* connection before any byte of the response arrived. A timeout, a failure on a
fresh connection, or one after the response started, is raised as it was.

Only for requests that are safe to send twice (the tracer's create, collect, delete).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

log = logging.getLogger("tito.client")

MAX_STALE_RETRIES = 2
Trace = Callable[[str, dict[str, Any]], Awaitable[None]]


class _Attempt:
    """What httpcore's trace events told about one attempt."""

    __slots__ = ("connected", "outer", "responding")

    def __init__(self, outer: Trace | None) -> None:
        self.outer = outer
        """The caller's own trace callback (``extensions={"trace": ...}``), told too."""
        self.connected = False
        """A new connection was opened for it (else: a pooled one was reused)."""
        self.responding = False
        """The response's headers arrived."""

    async def trace(self, name: str, info: dict[str, Any]) -> None:
        if name.startswith("connection.connect_"):
            self.connected = True
        elif name.endswith(".receive_response_headers.complete"):
            self.responding = True
        if self.outer is not None:
            await self.outer(name, info)


def never_sent(exc: httpx.HTTPError, attempt: _Attempt) -> bool:
    """Whether ``exc`` is a reused connection that the server closed before it read the
    request (no timeout, no response byte, no new connection)."""
    if isinstance(exc, httpx.TimeoutException) or not isinstance(exc, httpx.TransportError):
        return False
    if attempt.connected or attempt.responding:
        return False
    return isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError)


async def send_idempotent(client: httpx.AsyncClient, method: str, url: str,
                          **kwargs: Any) -> httpx.Response:
    """``client.request(method, url, **kwargs)``, sent again when it failed on a stale
    pooled connection (see the module)."""
    extensions = dict(kwargs.pop("extensions", None) or {})
    outer = extensions.get("trace")
    for tries_left in range(MAX_STALE_RETRIES, -1, -1):
        attempt = _Attempt(outer)
        try:
            return await client.request(method, url, **kwargs,
                                         extensions={**extensions, "trace": attempt.trace})
        except httpx.HTTPError as exc:
            if tries_left == 0 or not never_sent(exc, attempt):
                raise
            log.info("%s %s: the reused connection was closed before the request was "
                     "read (%r); sending it again", method, url, exc)
    raise AssertionError("unreachable")
