"""Listening sockets for our HTTP servers."""

from __future__ import annotations

import asyncio
import socket
from typing import Any


def bind_tcp(host: str, port: int) -> socket.socket:
    """A bound TCP socket (``port`` 0: any free port) to hand to uvicorn.

    The protocol is given explicitly: asyncio sets TCP_NODELAY only on ``IPPROTO_TCP``
    sockets, and without it every small response waits ~40 ms for a delayed ACK (Nagle).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve_forever(app: Any, sock: socket.socket, *, name: str, log_level: str,
                  **uvicorn_options: Any) -> None:
    """Run ``app`` with uvicorn on ``sock``; print ``<name> listening on URL`` once accepting.

    Test fixtures and scripts read that line to find a port picked with ``--port 0``.
    """
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False,
                                           **uvicorn_options))

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.005)
        if server.started:
            print(f"{name} listening on {url_of(sock)}", flush=True)
        await task

    asyncio.run(main())
