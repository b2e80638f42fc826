"""A client that goes away mid-turn: the engine request is aborted, the session is left as
it was (nothing committed, no 409 for the retry), and the disconnect is counted."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from helpers.fakes import FakeEngine

from tito.net import AppServer, bind_tcp
from tito.server.app import create_app
from tito.server.gateway import Gateway


@pytest.fixture
async def served(make_gateway: Any) -> AsyncIterator[tuple[Gateway, str]]:
    gateway = make_gateway()
    server = AppServer(create_app(gateway), bind_tcp("127.0.0.1", 0))
    await server.start()
    try:
        yield gateway, server.url
    finally:
        await server.stop()


def send_and_hang_up(url: str, path: str, body: dict[str, Any]) -> None:
    """Send one request, then close the connection without reading the reply."""
    host, port = url.removeprefix("http://").split(":")
    data = orjson.dumps(body)
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: "
                     f"application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data)


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_aborts_the_engine_and_releases_the_session(
        served: tuple[Gateway, str], stream: bool) -> None:
    gateway, url = served
    engine = gateway.engine
    assert isinstance(engine, FakeEngine)
    async with httpx.AsyncClient(base_url=url) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        engine.gate = asyncio.Event()  # the generation runs until we let it go
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": stream}
        await asyncio.to_thread(send_and_hang_up, url,
                                f"/sessions/{sid}/v1/chat/completions", body)
        for _ in range(500):  # the engine saw the request, then the abort
            if engine.aborted:
                break
            await asyncio.sleep(0.01)
        assert [call.rid for call in engine.calls] == engine.aborted
        info = (await http.get(f"/sessions/{sid}")).json()["metadata"]
        assert info["num_turns"] == 0 and not info["turn_in_progress"]
        engine.gate = None  # the retry is served at once, not 409
        resp = await http.post(f"/sessions/{sid}/v1/chat/completions", json=body)
        assert resp.status_code == 200
        info = (await http.get(f"/sessions/{sid}")).json()["metadata"]
        assert info["num_turns"] == 1
        metrics = (await http.get("/metrics")).text
        assert "tito_client_disconnects_total 1" in metrics
        assert "tito_engine_aborts_total 1" in metrics


async def test_disconnect_during_upload_is_not_a_server_error(
        served: tuple[Gateway, str]) -> None:
    _, url = served
    async with httpx.AsyncClient(base_url=url) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        host, port = url.removeprefix("http://").split(":")

        def upload_half() -> None:
            with socket.create_connection((host, int(port))) as conn:
                conn.sendall(f"POST /sessions/{sid}/v1/chat/completions HTTP/1.1\r\nhost: "
                             "127.0.0.1\r\ncontent-type: application/json\r\n"
                             "content-length: 100000\r\n\r\n{\"messages\": [".encode())

        await asyncio.to_thread(upload_half)
        for _ in range(200):
            metrics = (await http.get("/metrics")).text
            if "tito_client_disconnects_total 1" in metrics:
                break
            await asyncio.sleep(0.01)
        assert "tito_client_disconnects_total 1" in metrics
        assert 'status="500"' not in metrics


async def test_one_hang_up_among_several_turns_aborts_only_its_own(
        served: tuple[Gateway, str]) -> None:
    """Turns in flight share one watch timer per event loop: the client that hangs up gets
    its engine request aborted; the two others, held past the watch delay, still answer."""
    gateway, url = served
    engine = gateway.engine
    assert isinstance(engine, FakeEngine)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        sids = [(await http.post("/sessions")).json()["session_id"] for _ in range(3)]
        engine.gate = asyncio.Event()
        kept = [asyncio.create_task(http.post(f"/sessions/{sid}/v1/chat/completions",
                                              json=body)) for sid in sids[1:]]
        await asyncio.to_thread(send_and_hang_up, url,
                                f"/sessions/{sids[0]}/v1/chat/completions", body)
        for _ in range(500):
            if engine.aborted:
                break
            await asyncio.sleep(0.01)
        assert [rid.startswith(sids[0]) for rid in engine.aborted] == [True]
        engine.gate.set()
        replies = await asyncio.gather(*kept)
        assert [r.status_code for r in replies] == [200, 200]
        assert len(engine.aborted) == 1


def test_the_watch_timers_do_not_keep_closed_loops_alive() -> None:
    import gc
    import weakref

    from tito.server import http

    async def watch_once() -> None:
        http._pending_watches(asyncio.get_running_loop())

    refs = []
    for _ in range(3):
        loop = asyncio.new_event_loop()
        loop.run_until_complete(watch_once())
        refs.append(weakref.ref(loop))
        loop.close()
        del loop
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
