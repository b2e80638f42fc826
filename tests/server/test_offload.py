"""Big requests are worked on off the event loop: while one is being rendered (a turn, a
count_tokens) or checked (a /samples body with a big metadata), another session's turn
and /health are served. Proved with a step that blocks its worker thread until the test
lets it go (no timing involved)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from tito.net import AppServer, bind_tcp
from tito.samples import decode_samples
from tito.server import samples
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


class Gate:
    """Blocks a function when a worker thread calls it, until :meth:`open`."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def wrap(self, real: Any) -> Any:
        def gated(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not threading.main_thread():
                self.entered.set()
                assert self.released.wait(30), "never released"
            return real(*args, **kwargs)

        return gated

    async def reached(self) -> bool:
        return await asyncio.to_thread(self.entered.wait, 30)


async def others_are_served(http: httpx.AsyncClient) -> None:
    assert (await http.get("/health")).status_code == 200
    sid = (await http.post("/sessions")).json()["session_id"]
    small = await http.post(f"/sessions/{sid}/v1/chat/completions",
                            json={"messages": [{"role": "user", "content": "hi"}]})
    assert small.status_code == 200
    count = await http.post(f"/sessions/{sid}/v1/messages/count_tokens",
                            json={"messages": [{"role": "user", "content": "hi"}]})
    assert count.status_code == 200 and count.json()["input_tokens"] > 0


async def test_a_big_count_tokens_does_not_block_other_sessions(
        make_gateway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gateway: Gateway = make_gateway()
    gate = Gate()
    monkeypatch.setattr(gateway.renderer, "render_prompt",
                        gate.wrap(gateway.renderer.render_prompt))
    server = AppServer(create_app(gateway), bind_tcp("127.0.0.1", 0))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            sid = (await http.post("/sessions")).json()["session_id"]
            big = {"messages": [{"role": "user", "content": "word " * (OFFLOAD_BYTES // 4)}]}
            counting = asyncio.create_task(
                http.post(f"/sessions/{sid}/v1/messages/count_tokens", json=big))
            assert await gate.reached()  # its prompt is being rendered in a worker
            await others_are_served(http)
            # its session is claimed while the count renders, as by an offloaded turn
            turn = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                   json={"messages": [{"role": "user", "content": "hi"}]})
            assert turn.status_code == 409
            assert not counting.done()
            gate.released.set()
            resp = await counting
            assert resp.status_code == 200, resp.text
            assert resp.json()["input_tokens"] > OFFLOAD_BYTES // 8
            meta = (await http.get(f"/sessions/{sid}")).json()["metadata"]
            assert meta["num_turns"] == 0 and not meta["turn_in_progress"]  # released
    finally:
        gate.released.set()
        await server.stop()


async def test_a_big_samples_metadata_does_not_block_other_sessions(
        make_gateway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gateway: Gateway = make_gateway()
    gate = Gate()
    monkeypatch.setattr(samples, "check_depth", gate.wrap(samples.check_depth))
    server = AppServer(create_app(gateway), bind_tcp("127.0.0.1", 0))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            sid = (await http.post("/sessions")).json()["session_id"]
            first = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                    json={"messages": [{"role": "user", "content": "hi"}]})
            assert first.status_code == 200
            blob = ["x" * 64] * (OFFLOAD_BYTES // 64)
            collecting = asyncio.create_task(
                http.post(f"/sessions/{sid}/samples", json={"metadata": {"blob": blob}}))
            assert await gate.reached()  # its body is being checked in a worker
            await others_are_served(http)
            assert not collecting.done()
            gate.released.set()
            resp = await collecting
            assert resp.status_code == 200, resp.text
            [sample] = decode_samples(resp.content).samples
            assert sample.metadata["blob"] == blob
    finally:
        gate.released.set()
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


async def test_a_big_body_that_grows_by_a_little_stays_on_the_event_loop(
        make_gateway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """What is offloaded is a body with much to work on: a long conversation's body that
    extends the last one by a small message is decoded and planned on the loop (its
    decode and bridge read only the new part); one that adds a big message is not."""
    from helpers.inproc import asgi_client, new_session

    gateway: Gateway = make_gateway()
    where: list[str] = []

    def recorded(real: Any, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            main = threading.current_thread() is threading.main_thread()
            where.append(f"{name} {'loop' if main else 'worker'}")
            return real(*args, **kwargs)

        return call

    renderer = gateway.renderer
    monkeypatch.setattr(renderer, "render_prompt", recorded(renderer.render_prompt, "render"))
    monkeypatch.setattr(renderer, "bridge", recorded(renderer.bridge, "bridge"))
    gateway.engine.script("one", "two", "three")  # type: ignore[attr-defined]
    big = "word " * (OFFLOAD_BYTES // 4)
    messages: list[dict[str, Any]] = [{"role": "user", "content": big}]
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        for reply, added in (("one", "small"), ("two", big + "again"), ("three", None)):
            resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                   json={"messages": messages})
            assert resp.status_code == 200, resp.text
            if added is not None:
                messages += [{"role": "assistant", "content": reply},
                             {"role": "user", "content": added}]
    assert where == ["render worker", "bridge loop", "bridge worker"]
