"""A reverse proxy that closes client connections on cue, to reproduce two network
failures deterministically in front of a real gateway:

- ``DROP_BEFORE``: the connection is closed when a request arrives, before the gateway
  sees it — what a client meets when it reuses a pooled connection the server is closing
  as idle (the keep-alive race);
- ``DROP_AFTER``: the request is forwarded, the gateway's whole answer read (the turn
  committed), then the client's connection is closed without it — the answer lost on the
  way back, which makes an SDK retry.

HTTP/1.1 with ``Content-Length`` request bodies (what httpx and the SDKs send). Client
connections are kept alive; each request goes upstream on its own connection
(``Connection: close``), its reply read to the end and passed on without that header.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

FORWARD, DROP_BEFORE, DROP_AFTER = "forward", "drop_before", "drop_after"


@dataclass
class Exchange:
    """One request the proxy received."""

    connection: int
    """The client connection's number (from 0, in accept order)."""
    index: int
    """The request's number on its connection (0: the first; above: a reused one)."""
    method: str
    path: str
    headers: dict[str, str]
    action: str = FORWARD


Rule = Callable[[Exchange], str]


@dataclass
class DroppingProxy:
    upstream: str
    """``http://host:port`` of the gateway."""
    rule: Rule = field(default=lambda exchange: FORWARD)
    exchanges: list[Exchange] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _connections: int = 0

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def __aenter__(self) -> DroppingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    def dropped(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.action != FORWARD]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self._connections
        self._connections += 1
        try:
            for index in range(1 << 30):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed its connection
                exchange = parse_head(head, number, index)
                body = await reader.readexactly(int(exchange.headers.get("content-length",
                                                                         "0")))
                exchange.action = self.rule(exchange)
                self.exchanges.append(exchange)
                if exchange.action == DROP_BEFORE:
                    return
                reply = await self._forward(head, body)
                if exchange.action == DROP_AFTER:
                    return
                writer.write(reply)
                await writer.drain()
        finally:
            writer.close()

    async def _forward(self, head: bytes, body: bytes) -> bytes:
        host, port = self.upstream.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(with_connection(head, b"close") + body)
            await writer.drain()
            reply = await reader.read()  # to the end: the upstream closes after it
        finally:
            writer.close()
        reply_head, sep, rest = reply.partition(b"\r\n\r\n")
        return with_connection(reply_head + sep, None) + rest


def parse_head(head: bytes, connection: int, index: int) -> Exchange:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return Exchange(connection, index, method, path, headers)


def with_connection(head: bytes, value: bytes | None) -> bytes:
    """``head`` (ending in a blank line) without its ``Connection`` header, plus
    ``Connection: value`` when given."""
    lines = [line for line in head.split(b"\r\n")[:-2]
             if not line.lower().startswith(b"connection:")]
    if value is not None:
        lines.append(b"Connection: " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n"
