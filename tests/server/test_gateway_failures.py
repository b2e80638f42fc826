"""Concurrency and engine failures: 409 at once, 502/504 with the session unchanged."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.support import Proc, start_tito

from tito.samples import decode_samples

pytestmark = pytest.mark.slow  # a gateway (and engine) process per case


@pytest.fixture(scope="module")
def slow_stack(qwen3_dir: Path) -> Any:
    engine = start_tito("mock-engine", "--tokenizer", str(qwen3_dir), "--family", "qwen3",
                        "--port", "0", "--latency-ms", "400")
    gateway = start_tito("serve", "--engine-url", engine.url, "--tokenizer", str(qwen3_dir),
                         "--family", "qwen3", "--port", "0", "--engine-timeout", "5")
    yield engine, gateway
    gateway.stop()
    engine.stop()


def chat(url: str, sid: str, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(f"{url}/sessions/{sid}/v1/chat/completions",
                      json={"messages": messages}, timeout=30)


async def test_concurrent_turn_is_409_immediately(slow_stack: Any) -> None:
    _, gateway = slow_stack
    sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
    url = f"{gateway.url}/sessions/{sid}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=30) as client:
        first = asyncio.create_task(client.post(url, json={
            "messages": [{"role": "user", "content": "SAY first"}]}))
        await asyncio.sleep(0.15)
        loop = asyncio.get_running_loop()
        start = loop.time()
        second = await client.post(url, json={"messages": [{"role": "user", "content": "x"}]})
        elapsed = loop.time() - start
        assert second.status_code == 409
        assert second.json()["error"]["code"] == "turn_in_progress"
        assert elapsed < 0.3  # answered at once, not after the running turn
        samples_during = await client.post(f"{gateway.url}/sessions/{sid}/samples", json={})
        assert samples_during.status_code == 200  # what is committed: nothing yet
        during = decode_samples(samples_during.content)
        assert during.empty_reason == "no_records"
        assert during.session_metadata["turn_in_progress"] is True
        assert (await first).status_code == 200
    info = httpx.get(f"{gateway.url}/sessions/{sid}?include_messages=true").json()
    assert info["metadata"]["num_turns"] == 1
    assert info["messages"][0]["content"] == "SAY first"


async def test_delete_during_turn(slow_stack: Any) -> None:
    _, gateway = slow_stack
    sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
    async with httpx.AsyncClient(timeout=30) as client:
        turn = asyncio.create_task(client.post(
            f"{gateway.url}/sessions/{sid}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "SAY x"}]}))
        await asyncio.sleep(0.15)
        assert (await client.delete(f"{gateway.url}/sessions/{sid}")).status_code == 204
        assert (await turn).status_code == 200  # the agent still gets its reply
        assert (await client.get(f"{gateway.url}/sessions/{sid}")).status_code == 410


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_engine_down_is_502_and_session_unchanged(qwen3_dir: Path) -> None:
    gateway: Proc = start_tito("serve", "--engine-url", f"http://127.0.0.1:{free_port()}",
                               "--tokenizer", str(qwen3_dir), "--family", "qwen3",
                               "--port", "0")
    try:
        sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
        resp = chat(gateway.url, sid, [{"role": "user", "content": "hi"}])
        assert resp.status_code == 502
        assert resp.json()["error"]["code"] == "engine_error"
        info = httpx.get(f"{gateway.url}/sessions/{sid}").json()
        assert info["metadata"]["num_turns"] == 0 and not info["metadata"]["turn_in_progress"]
    finally:
        gateway.stop()


def test_engine_timeout_is_504(qwen3_dir: Path) -> None:
    engine = start_tito("mock-engine", "--tokenizer", str(qwen3_dir), "--family", "qwen3",
                        "--port", "0", "--latency-ms", "3000")
    gateway = start_tito("serve", "--engine-url", engine.url, "--tokenizer", str(qwen3_dir),
                         "--family", "qwen3", "--port", "0", "--engine-timeout", "0.5")
    try:
        sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
        resp = chat(gateway.url, sid, [{"role": "user", "content": "SAY x"}])
        assert resp.status_code == 504 and resp.json()["error"]["code"] == "engine_timeout"
        info = httpx.get(f"{gateway.url}/sessions/{sid}").json()
        assert info["metadata"]["num_turns"] == 0 and not info["metadata"]["turn_in_progress"]
    finally:
        gateway.stop()
        engine.stop()


def test_prompt_over_engine_context_is_400(qwen3_dir: Path) -> None:
    """The gateway reads the engine's max_model_len and rejects before generating."""
    engine = start_tito("mock-engine", "--tokenizer", str(qwen3_dir), "--family", "qwen3",
                        "--port", "0", "--context-length", "64")
    gateway = start_tito("serve", "--engine-url", engine.url, "--tokenizer", str(qwen3_dir),
                         "--family", "qwen3", "--port", "0")
    try:
        sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
        resp = chat(gateway.url, sid, [{"role": "user", "content": "word " * 200}])
        assert resp.status_code == 400
        assert resp.json()["error"]["code"] == "context_length_exceeded"
        assert "the engine's context length (64)" in resp.json()["error"]["message"]
        assert httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]["num_turns"] == 0
        # A short prompt gets max_tokens clamped to the room left, not an engine 400.
        resp = chat(gateway.url, sid, [{"role": "user", "content": "LONG 500"}])
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["finish_reason"] == "length"
        assert resp.json()["usage"]["total_tokens"] == 63
    finally:
        gateway.stop()
        engine.stop()


def test_max_seq_len_rejects_before_engine(qwen3_dir: Path, slow_stack: Any) -> None:
    engine, _ = slow_stack
    gateway = start_tito("serve", "--engine-url", engine.url, "--tokenizer", str(qwen3_dir),
                         "--family", "qwen3", "--port", "0", "--max-seq-len", "16")
    try:
        sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
        resp = chat(gateway.url, sid, [{"role": "user", "content": "word " * 40}])
        assert resp.status_code == 400
        assert resp.json()["error"]["code"] == "context_length_exceeded"
    finally:
        gateway.stop()
