"""How a reply with faults (:mod:`tito.engines.mock.faults`) goes out on the wire:
an error status, a cut body, or a connection closed under the client."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Sequence
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from tito.engines.mock.faults import Fault, corrupt, terminal_fault

RAW_SEND = "tito.mock.send"
"""Scope key of the server's own ASGI ``send`` (its bound request cycle holds the
connection's transport; Starlette's middleware wraps the ``send`` endpoints see)."""


def connection_transport(request: Request) -> asyncio.Transport | None:
    """The connection's transport (uvicorn's request cycle holds it)."""
    send = request.scope.get(RAW_SEND)
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    return transport if isinstance(transport, asyncio.Transport) else None


async def _until_disconnected(request: Request) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(2.0):
            while (await request.receive())["type"] != "http.disconnect":
                pass


async def _reset(request: Request, body: bytes, *, partial: bool) -> Response:
    """Close the connection without a response (RST), or after half of one (FIN)."""
    transport = connection_transport(request)
    if transport is None:
        raise RuntimeError("fault reset needs uvicorn (no transport found)")
    if partial:
        head = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n" % len(body))
        transport.write(head + body[: len(body) // 2])
        transport.close()  # flushes what was written, then FIN
    else:
        sock = transport.get_extra_info("socket")
        if sock is not None:  # linger 0: close() sends RST
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    await _until_disconnected(request)
    return Response(status_code=200)  # never sent: the server sees the connection gone


async def faulty_response(request: Request, result: dict[str, Any], faults: Sequence[Fault],
                          *, vocab_size: int) -> Response:
    """The reply to a request with faults (``result``: its normal result object)."""
    terminal = terminal_fault(faults)
    if terminal is not None and terminal.mode == "http_500":
        detail = f"Internal server error (mock fault {terminal.spec})"
        return Response(orjson.dumps({"detail": detail}), status_code=terminal.status,
                        media_type="application/json")
    corrupt(result, faults, vocab_size=vocab_size)
    body = orjson.dumps(result)
    if terminal is None:
        return Response(body, media_type="application/json")
    if terminal.mode == "malformed_json":
        return Response(body[: len(body) // 2], media_type="application/json")
    return await _reset(request, body, partial=terminal.arg == "partial")
