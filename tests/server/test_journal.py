"""Crash-safe sessions (--journal): replay brings back every created session and committed
turn bit for bit; deleted ones come back gone (410); torn tails are survived; fsyncs are
batched. The kill -9 test runs real processes."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from helpers.fakes import FakeEngine
from helpers.inproc import asgi_client, new_session
from helpers.support import start_gateway, start_mock

from tito.samples import decode_samples
from tito.server.gateway import Gateway
from tito.server.journal import FILE, Journal, frame
from tito.server.journal.scan import Damage, frames, mapped
from tito.types.errors import ConfigError


def read_frames(path: Path) -> list[Any]:
    """The intact frames of a journal file (their arrays copied out of the mapping)."""
    with mapped(path) as buf:
        out = []
        for item in frames(buf):
            assert not isinstance(item, Damage), item
            item.arrays = memoryview(bytes(item.arrays))
            out.append(item)
        return out


async def chat(http: httpx.AsyncClient, sid: str, messages: list[Any]) -> Any:
    resp = await http.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": messages})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]


async def view(http: httpx.AsyncClient, sid: str) -> Any:
    body = (await http.get(f"/sessions/{sid}", params={"include_ids": "1",
                                                      "include_messages": "1"})).json()
    body["metadata"].pop("last_active")
    return body


async def samples(http: httpx.AsyncClient, sid: str) -> Any:
    resp = await http.post(f"/sessions/{sid}/samples", json={})
    assert resp.status_code == 200
    [sample] = decode_samples(resp.content).samples
    return (sample.tokens.tolist(), sample.loss_mask.tolist(),  # type: ignore[union-attr]
            sample.rollout_log_probs.tolist(), sample.response)  # type: ignore[union-attr]


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_replay_restores_sessions_bit_for_bit(make_gateway: Any, tmp_path: Path,
                                                    version: str) -> None:
    first: Gateway = make_gateway(journal=str(tmp_path), session_version=version)
    sids, views, outs = [], {}, {}
    async with asgi_client(first) as http:
        for n in range(3):
            sid = await new_session(http)
            messages: list[Any] = [{"role": "user", "content": f"task {n}"}]
            for t in range(n + 1):
                messages += [await chat(http, sid, messages),
                             {"role": "user", "content": f"more {t}"}]
            if n == 2:  # a retry that rolls the last turn back, journaled as such
                await chat(http, sid, [*messages[:-2], {"role": "user", "content": "again"}])
            sids.append(sid)
            views[sid] = await view(http, sid)
            outs[sid] = await samples(http, sid)
        gone = await new_session(http)
        assert (await http.delete(f"/sessions/{gone}")).status_code == 204
    assert first.journal is not None
    first.journal.close()

    second: Gateway = make_gateway(journal=str(tmp_path), session_version=version)
    async with asgi_client(second) as http:
        for sid in sids:
            assert await view(http, sid) == views[sid]
            assert await samples(http, sid) == outs[sid]
        assert (await http.get(f"/sessions/{gone}")).status_code == 410
        # a restored session goes on: its next prompt extends the stored ids bit for bit
        sid = sids[0]
        engine: FakeEngine = second.engine  # type: ignore[assignment]
        stored = views[sid]["records"]
        ids = [i for rec in stored for i in rec["bridge_ids"] + rec["output_ids"]]
        await chat(http, sid, [*views[sid]["messages"], {"role": "user", "content": "next"}])
        assert engine.calls[-1].input_ids[: len(ids)] == ids
        assert (await view(http, sid))["metadata"]["num_turns"] == 2


async def test_fsyncs_are_batched(make_gateway: Any, tmp_path: Path) -> None:
    gateway: Gateway = make_gateway(journal=str(tmp_path))
    async with asgi_client(gateway) as http:
        sids = [await new_session(http) for _ in range(16)]
        journal = gateway.journal
        assert journal is not None
        before = (journal.syncs, journal.frames_written)
        await asyncio.gather(*(chat(http, sid, [{"role": "user", "content": "go"}])
                               for sid in sids))
        syncs, frames = journal.syncs - before[0], journal.frames_written - before[1]
    assert frames == 16 and syncs < frames
    journal.close()


def test_unwritable_journal_folder_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="--journal"):
        Journal(blocker / "sub")


@pytest.mark.slow
async def test_kill_9_under_load_loses_no_answered_turn(qwen3_dir: Path, tmp_path: Path) -> None:
    """`tito serve --journal` is SIGKILLed while 24 agents run; restarted on the same
    journal, every turn whose reply an agent received is there (and nothing is torn)."""
    engine = start_mock(qwen3_dir, "qwen3", "--latency-ms", "20")
    gateway = start_gateway(engine.url, qwen3_dir, "qwen3", "--journal", str(tmp_path))
    answered: dict[str, int] = {}
    stop = asyncio.Event()

    async def agent(http: httpx.AsyncClient) -> None:
        sid = (await http.post("/sessions")).json()["session_id"]
        answered[sid] = 0
        messages: list[Any] = [{"role": "user", "content": "SAY hi"}]
        while not stop.is_set():
            try:
                resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                       json={"messages": messages})
            except httpx.HTTPError:
                return  # the server died under us
            if resp.status_code != 200:
                return
            answered[sid] += 1
            messages += [resp.json()["choices"][0]["message"],
                         {"role": "user", "content": f"SAY turn {answered[sid]}"}]

    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
            agents = [asyncio.create_task(agent(http)) for _ in range(24)]
            while sum(answered.values()) < 150:
                await asyncio.sleep(0.02)
            os.kill(gateway.pid, signal.SIGKILL)  # mid-load: turns are in flight
            stop.set()
            await asyncio.gather(*agents)
        gateway.process.wait()
        restarted = start_gateway(engine.url, qwen3_dir, "qwen3", "--journal", str(tmp_path))
        try:
            async with httpx.AsyncClient(base_url=restarted.url, timeout=10) as http:
                for sid, count in answered.items():
                    info = (await http.get(f"/sessions/{sid}")).json()["metadata"]
                    # every answered turn is there; at most one more was committed unanswered
                    assert count <= info["num_turns"] <= count + 1, sid
                    assert (await http.post(f"/sessions/{sid}/samples",
                                            json={})).status_code == 200
        finally:
            restarted.stop()
    finally:
        gateway.stop()
        engine.stop()


# -- agent contexts (design §5.5) ------------------------------------------------------------
TOOLS = [{"type": "function", "function": {"name": "Agent", "parameters": {
    "type": "object", "properties": {"prompt": {"type": "string"}}}}}]


async def turn(http: httpx.AsyncClient, sid: str, messages: list[Any],
               headers: dict[str, str] | None = None, **body: Any) -> Any:
    resp = await http.post(f"/sessions/{sid}/v1/chat/completions", headers=headers or {},
                           json={"messages": messages, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]


async def agents(http: httpx.AsyncClient, sid: str) -> None:
    """A main agent with tools, a named sub-agent, an inferred one and a side request."""
    main: list[Any] = [{"role": "user", "content": "main task"}]
    main += [await turn(http, sid, main, tools=TOOLS), {"role": "user", "content": "more"}]
    named = {"X-Tito-Agent-Id": "reviewer", "X-Tito-Parent-Agent-Id": "main",
             "X-Tito-Parent-Tool-Call-Id": "call_9"}
    sub: list[Any] = [{"role": "user", "content": "review task"}]
    sub += [await turn(http, sid, sub, named), {"role": "user", "content": "and?"}]
    await turn(http, sid, sub, named)
    await turn(http, sid, [{"role": "user", "content": "inferred task"}])
    await turn(http, sid, [{"role": "user", "content": "name it"}],
               response_format={"type": "json_schema", "json_schema": {"name": "t"}})
    await turn(http, sid, main, tools=TOOLS)


async def contexts_view(http: httpx.AsyncClient, sid: str) -> Any:
    whole = await view(http, sid)
    ids = [c["context_id"] for c in whole["metadata"]["contexts"]]
    parts = {}
    for context in ids:
        part = (await http.get(f"/sessions/{sid}", params={
            "context": context, "include_ids": "1", "include_messages": "1"})).json()
        part["metadata"].pop("last_active")
        parts[context] = part
    return whole, parts


async def all_samples(http: httpx.AsyncClient, sid: str) -> Any:
    resp = await http.post(f"/sessions/{sid}/samples", json={})
    assert resp.status_code == 200
    decoded = decode_samples(resp.content)
    return [(s.tokens.tolist(), s.loss_mask.tolist(),  # type: ignore[union-attr]
             {k: s.metadata[k] for k in ("agent_id", "context_id", "parent_agent_id",
                                         "parent_tool_call_id", "role")})
            for s in decoded.samples], decoded.session_metadata["contexts"]


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_replay_restores_agent_contexts(make_gateway: Any, tmp_path: Path,
                                              version: str) -> None:
    first: Gateway = make_gateway(journal=str(tmp_path), session_version=version)
    async with asgi_client(first) as http:
        sid = await new_session(http)
        await agents(http, sid)
        before, out = await contexts_view(http, sid), await all_samples(http, sid)
    assert first.journal is not None
    first.journal.close()
    headers = [f.header for f in read_frames(tmp_path / FILE)]
    contexts = [h.get("context", {}).get("id") for h in headers if h["op"] == "turn"]
    assert contexts == [None, "reviewer", "reviewer", "agent-2", "side-3", None]
    assert [r for *_, r in out[0]] == [
        {"agent_id": "main", "context_id": "main", "parent_agent_id": None,
         "parent_tool_call_id": None, "role": "main"},
        {"agent_id": "reviewer", "context_id": "reviewer", "parent_agent_id": "main",
         "parent_tool_call_id": "call_9", "role": "subagent"},
        {"agent_id": "agent-2", "context_id": "agent-2", "parent_agent_id": "main",
         "parent_tool_call_id": None, "role": "subagent"}]

    second: Gateway = make_gateway(journal=str(tmp_path), session_version=version)
    async with asgi_client(second) as http:
        assert await contexts_view(http, sid) == before
        assert await all_samples(http, sid) == out
        # the restored contexts go on: the sub-agent is still the sub-agent
        sub = before[1]["reviewer"]["messages"]
        await turn(http, sid, [*sub, {"role": "user", "content": "last"}],
                   {"X-Tito-Agent-Id": "reviewer"})
        assert (await view(http, sid))["metadata"]["contexts"][1]["num_turns"] == 3


async def test_a_journal_without_contexts_replays_into_the_main_context(
        make_gateway: Any, tmp_path: Path) -> None:
    """Frames without a ``context`` field (older journals) are the main context's."""
    first: Gateway = make_gateway(journal=str(tmp_path))
    async with asgi_client(first) as http:
        sid = await new_session(http)
        messages: list[Any] = [{"role": "user", "content": "task"}]
        headers = {"X-Tito-Agent-Id": "solo"}  # the session's first agent: the main one
        messages += [await turn(http, sid, messages, headers),
                     {"role": "user", "content": "more"}]
        await turn(http, sid, messages, headers)
        named = await all_samples(http, sid)
    assert first.journal is not None
    first.journal.close()
    path = tmp_path / FILE
    old = path.read_bytes()[:8]
    for f in read_frames(path):
        f.header.pop("context", None)
        old += frame(f.header, np.frombuffer(bytes(f.arrays), dtype=np.uint8), seq=f.seq)
    path.write_bytes(old)
    second: Gateway = make_gateway(journal=str(tmp_path))
    async with asgi_client(second) as http:
        meta = (await view(http, sid))["metadata"]
        assert meta["num_turns"] == 2 and "contexts" not in meta
        resp = await http.post(f"/sessions/{sid}/samples", json={})
        [sample] = decode_samples(resp.content).samples
        assert sample.tokens.tolist() == named[0][0][0]
        assert "context_id" not in sample.metadata
