"""Big requests are worked on off the event loop: while one is being rendered, another
session's turn and /health are served. Proved with a renderer that blocks its worker
thread until the test lets it go (no timing involved)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from tito.net import AppServer, bind_tcp
from tito.server.app import create_app
from tito.server.gateway import Gateway
from tito.server.serving import OFFLOAD_BYTES


async def test_a_big_request_does_not_block_other_sessions(
        make_gateway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gateway: Gateway = make_gateway()
    release = threading.Event()
    entered = threading.Event()
    real = gateway.renderer.render_prompt

    def render_prompt(messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            entered.set()
            assert release.wait(30), "never released"
        return real(messages, **kwargs)

    monkeypatch.setattr(gateway.renderer, "render_prompt", render_prompt)
    server = AppServer(create_app(gateway), bind_tcp("127.0.0.1", 0))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            big_sid = (await http.post("/sessions")).json()["session_id"]
            big = {"messages": [{"role": "user", "content": "word " * (OFFLOAD_BYTES // 4)}]}
            big_turn = asyncio.create_task(
                http.post(f"/sessions/{big_sid}/v1/chat/completions", json=big))
            assert await asyncio.to_thread(entered.wait, 30)  # its render is running
            # meanwhile the loop serves everyone else
            assert (await http.get("/health")).status_code == 200
            sid = (await http.post("/sessions")).json()["session_id"]
            small = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                    json={"messages": [{"role": "user", "content": "hi"}]})
            assert small.status_code == 200
            # the big session is claimed while its prompt renders: a second turn is 409
            second = await http.post(f"/sessions/{big_sid}/v1/chat/completions", json=big)
            assert second.status_code == 409
            assert not big_turn.done()
            release.set()
            resp = await big_turn
            assert resp.status_code == 200
            assert resp.json()["usage"]["prompt_tokens"] > OFFLOAD_BYTES // 8
    finally:
        release.set()
        await server.stop()


async def test_max_prompt_tokens(make_gateway: Any) -> None:
    from helpers.inproc import asgi_client, new_session

    async with asgi_client(make_gateway(max_prompt_tokens=20)) as http:
        sid = await new_session(http)
        resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                               json={"messages": [{"role": "user", "content": "word " * 50}]})
        assert resp.status_code == 400
        assert resp.json()["error"]["code"] == "prompt_too_long"
        assert "--max-prompt-tokens 20" in resp.json()["error"]["message"]
        info = (await http.get(f"/sessions/{sid}")).json()["metadata"]
        assert info["num_turns"] == 0 and not info["turn_in_progress"]
