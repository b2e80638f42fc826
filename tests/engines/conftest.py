"""Fixtures of the engine tests: the mock engine's model and local servers on port 0.

``serve`` runs an ASGI app with :class:`tito.net.AppServer` in the test's event loop;
``serve_in_thread`` runs it in a thread with its own loop, as a separate engine process
would (its socket closes while the test's loop is busy); ``web_server`` serves small
aiohttp handlers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiohttp import web
from helpers.support import tokenizer_dir

from tito.engines.mock import MockConfig, MockEngine, MockModel
from tito.net import AppServer, bind_tcp, url_of
from tito.render import build_renderer

Serve = Callable[..., Awaitable[str]]


@pytest.fixture(scope="session")
def mock_model() -> MockModel:
    """The mock's scripted model: SmolLM2's tokenizer, ChatML replies."""
    return MockModel(build_renderer("chatml", tokenizer_dir("smollm2")))


@pytest.fixture
def make_mock(mock_model: MockModel) -> Callable[..., MockEngine]:
    """``make_mock(**config)``: a fresh mock engine (its own request log) over the model."""

    def make(**config: Any) -> MockEngine:
        cfg = MockConfig(tokenizer_dir=str(tokenizer_dir("smollm2")), family="chatml",
                         context_length=4096, **config)
        return MockEngine(cfg, mock_model)

    return make


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """``await serve(app, **uvicorn_options)``: its URL, served in this loop until the end."""
    servers: list[AppServer] = []

    async def start(app: Any, **options: Any) -> str:
        server = AppServer(app, bind_tcp("127.0.0.1", 0), **options)
        await server.start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        await server.stop()


class _ThreadServer:
    """An AppServer on its own event loop in a daemon thread."""

    def __init__(self, app: Any, options: dict[str, Any]) -> None:
        self.server = AppServer(app, bind_tcp("127.0.0.1", 0), **options)
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self._started.wait(30) or self._error is not None:
            raise RuntimeError(f"the threaded server did not start: {self._error!r}")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.start())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()
        self.loop.close()

    def stop(self) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.fixture
def serve_in_thread() -> Iterator[Callable[..., str]]:
    """``serve_in_thread(app, **uvicorn_options)``: its URL, served by another thread."""
    servers: list[_ThreadServer] = []

    def start(app: Any, **options: Any) -> str:
        server = _ThreadServer(app, options)
        servers.append(server)
        return server.server.url

    yield start
    for server in servers:
        server.stop()


Routes = dict[tuple[str, str], Callable[[web.Request], Awaitable[web.StreamResponse]]]


@pytest.fixture
async def web_server() -> AsyncIterator[Callable[[Routes], Awaitable[str]]]:
    """``await web_server({("GET", "/health"): handler, ...})``: its URL (aiohttp)."""
    runners: list[web.AppRunner] = []

    async def start(routes: Routes) -> str:
        app = web.Application()
        for (method, path), handler in routes.items():
            app.router.add_route(method, path, handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = bind_tcp("127.0.0.1", 0)
        await web.SockSite(runner, sock).start()
        runners.append(runner)
        return url_of(sock)

    yield start
    for runner in runners:
        await runner.cleanup()
