"""Engine control through the gateway, against the real `tito mock-engine` (token latency
on, so turns are in flight): pause holds new turns instead of failing them, an in-flight
turn aborted by a pause leaves the session retryable and gives an ABORTED sample with its
reason, weight-version updates are forwarded and recorded per token, LoRA names reach the
engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.inproc import asgi_client, new_session
from helpers.support import Proc, start_mock

from tito.config import ServerConfig
from tito.engines.sglang import SGLangEngine
from tito.render.base import TemplateRenderer
from tito.samples import decode_samples
from tito.server.gateway import Gateway

pytestmark = pytest.mark.slow  # real mock processes with replay/latency: the slow tier

@pytest.fixture(scope="module")
def slow_mock(qwen3_dir: Path) -> Iterator[Proc]:
    engine = start_mock(qwen3_dir, "qwen3", "--token-latency-ms", "20")
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture
async def gateway(slow_mock: Proc, qwen3_dir: Path, qwen3_renderer: TemplateRenderer
                  ) -> AsyncIterator[Gateway]:
    async with httpx.AsyncClient(base_url=slow_mock.url) as mock:
        await mock.post("/continue_generation", json={})
        await mock.post("/update_weight_version", json={"new_version": "v0"})
        await mock.delete("/mock/requests")
    cfg = ServerConfig(tokenizer=str(qwen3_dir), family="qwen3", engine="sglang",
                       engine_url=slow_mock.url, lora_name="my-adapter")
    engine = SGLangEngine(slow_mock.url, lora_path=cfg.lora_name)
    yield Gateway(cfg, qwen3_renderer, engine)
    await engine.close()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


LONG = user("tell me\nSAY " + " ".join(["word"] * 40))


async def started(gateway: Gateway, http: httpx.AsyncClient, sid: str,
                  messages: list[Any]) -> asyncio.Task[httpx.Response]:
    """A turn running on the engine (its first tokens generated)."""
    task = asyncio.create_task(http.post(f"/sessions/{sid}/v1/chat/completions",
                                         json={"messages": messages}))
    await asyncio.sleep(0.3)
    assert not task.done()
    return task


async def test_pause_holds_new_turns_until_continue(gateway: Gateway) -> None:
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        paused = await http.post("/pause", json={"mode": "in_place"})
        assert paused.json() == {"status": "ok", "paused": True, "mode": "in_place"}
        assert (await http.get("/health")).json()["paused"] == "in_place"
        task = asyncio.create_task(http.post(f"/sessions/{sid}/v1/chat/completions",
                                             json={"messages": [user("hi\nSAY yo")]}))
        await asyncio.sleep(0.3)
        assert not task.done()  # held, not failed
        assert (await http.post("/continue")).json() == {"status": "ok", "paused": False}
        resp = await asyncio.wait_for(task, 10)
        assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "yo"
        assert (await http.get("/health")).json()["paused"] is None
        bad = await http.post("/pause", json={"mode": "sideways"})
        assert bad.status_code == 400 and "unknown pause mode" in bad.json()["error"]["message"]


async def test_abort_pause_gives_a_retryable_aborted_turn(gateway: Gateway) -> None:
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        first = [user("hi\nSAY hello")]
        r0 = (await http.post(f"/sessions/{sid}/v1/chat/completions",
                              json={"messages": first})).json()
        messages = [*first, r0["choices"][0]["message"], LONG]
        task = await started(gateway, http, sid, messages)
        await http.post("/pause_generation", json={"mode": "abort"})
        resp = await asyncio.wait_for(task, 10)
        assert resp.status_code == 200 and resp.json()["choices"][0]["finish_reason"] == "abort"
        samples = decode_samples((await http.post(f"/sessions/{sid}/samples")).content)
        [sample] = samples.samples
        assert sample.status == "aborted"
        assert "abort" in sample.metadata["aborted_reason"].lower()
        await http.post("/continue_generation", json={})
        retry = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                json={"messages": messages})
        assert retry.json()["choices"][0]["finish_reason"] == "stop"
        view = (await http.get(f"/sessions/{sid}")).json()
        assert view["metadata"]["num_turns"] == 2 and view["records"][-1]["rolled_back"] == 1
        [after] = decode_samples((await http.post(f"/sessions/{sid}/samples")).content).samples
        assert after.status == "completed" and "aborted_reason" not in after.metadata


async def test_a_client_that_goes_on_after_an_abort_keeps_every_turn(gateway: Gateway) -> None:
    """No silent loss: the aborted reply stays in the sample (listed in ``aborted_turns``)
    and so do the turns the client sent after it."""
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        first = [user("hi\nSAY hello")]
        r0 = (await http.post(f"/sessions/{sid}/v1/chat/completions",
                              json={"messages": first})).json()
        messages = [*first, r0["choices"][0]["message"], LONG]
        task = await started(gateway, http, sid, messages)
        await http.post("/pause_generation", json={"mode": "abort"})
        aborted = (await asyncio.wait_for(task, 10)).json()["choices"][0]
        assert aborted["finish_reason"] == "abort"
        await http.post("/continue_generation", json={})
        on = await http.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": [
            *messages, aborted["message"], user("go on\nSAY done")]})
        assert on.status_code == 200 and on.json()["choices"][0]["finish_reason"] == "stop"
        [sample] = decode_samples((await http.post(f"/sessions/{sid}/samples")).content).samples
        assert sample.status == "completed" and len(sample.metadata["lifecycle"]) == 3
        [entry] = sample.metadata["aborted_turns"]
        assert entry["turn"] == 1 and "abort" in entry["reason"].lower()


async def test_weight_update_mid_turn_is_recorded_per_token(gateway: Gateway,
                                                           slow_mock: Proc) -> None:
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        task = await started(gateway, http, sid, [LONG])
        await http.post("/pause", json={"mode": "retract"})
        updated = await http.post("/update_weight_version", json={"new_version": "v1"})
        assert updated.json() == {"success": True, "new_version": "v1"}
        await http.post("/continue")
        resp = await asyncio.wait_for(task, 20)
        assert resp.status_code == 200
        [sample] = decode_samples((await http.post(f"/sessions/{sid}/samples")).content).samples
        bad = await http.post("/update_weight_version", json={"version": "v2"})
        assert bad.status_code == 400
    spans = sample.metadata["weight_version_spans"]
    assert [s["version"] for s in spans] == ["v0", "v1"]
    assert spans[0]["start"] == sample.prompt_length and spans[-1]["end"] == len(sample.tokens)
    assert spans[0]["end"] == spans[1]["start"]
    assert sample.weight_versions == ["v1"]  # the version the turn finished with
    async with httpx.AsyncClient(base_url=slow_mock.url) as mock:
        log = (await mock.get("/mock/requests")).json()
    assert log[-1]["lora_path"] == "my-adapter"
