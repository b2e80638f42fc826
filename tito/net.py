"""Listening sockets and uvicorn servers for our HTTP apps (the gateway, the mock engine).

Every server of ours listens on a socket from :func:`bind_tcp` and is run by
:class:`AppServer`, in-process (``tito rollout``, the demo, in-process tests) or as the
whole process (:func:`serve_forever`: ``tito serve``, ``tito mock-engine``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn


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


def free_port_block(n: int, host: str = "127.0.0.1") -> int:
    """A port P with P .. P+n-1 all free now (for ``tito serve --workers n``)."""
    for _ in range(50):
        base = random.randrange(20000, 60000 - n)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise OSError(f"no block of {n} free ports found")


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the embedding program handles Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class AppServer:
    """uvicorn serving ``app`` on ``sock`` in the running event loop.

    ``handle_signals``: let uvicorn shut down on SIGINT/SIGTERM (a whole-process server);
    off when the caller handles signals itself. ``access_log``: one line per request.
    """

    def __init__(self, app: Any, sock: socket.socket, *, log_level: str = "warning",
                 access_log: bool = False, handle_signals: bool = False,
                 **uvicorn_options: Any) -> None:
        config = uvicorn.Config(app, log_level=log_level, access_log=access_log,
                                lifespan="on", **uvicorn_options)
        self.server = uvicorn.Server(config) if handle_signals else _QuietServer(config)
        self.sock = sock
        self.url = url_of(sock)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve; return once accepting connections (raise if startup failed)."""
        self._task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started:
            if self._task.done():
                self._task.result()  # startup raised: re-raise it here
                raise RuntimeError("the server stopped during startup (see its log)")
            await asyncio.sleep(0.005)

    async def wait(self) -> None:
        """Until the server stops (a signal, or :meth:`stop`)."""
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        if self._task is not None:
            self.server.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
        self.sock.close()


def serve_forever(app: Any, sock: socket.socket, *, name: str, log_level: str,
                  access_log: bool = False, **uvicorn_options: Any) -> None:
    """Run ``app`` on ``sock`` as this process's server until a signal stops it.

    Prints ``<name> listening on URL`` once accepting: test fixtures and scripts read that
    line to find a port picked with ``--port 0``.
    """

    async def main() -> None:
        server = AppServer(app, sock, log_level=log_level, access_log=access_log,
                           handle_signals=True, **uvicorn_options)
        await server.start()
        print(f"{name} listening on {server.url}", flush=True)
        await server.wait()

    asyncio.run(main())
