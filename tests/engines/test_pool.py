"""Several engines behind one gateway (``tito serve --engine-url A --engine-url B``):
placement, stickiness, ejection and re-admission, aborts, broadcasts, per-engine metrics.
In-process over FakeEngines for the pool's rules; real processes (two ``tito mock-engine``
and a ``tito serve``) for the whole path."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers.fakes import FakeEngine
from helpers.inproc import asgi_client, new_session
from helpers.support import Proc, engine_log, start_gateway, start_mock, tokenizer_dir

from tito.config import ServerConfig
from tito.engines.mock import MockConfig, MockEngine, MockModel
from tito.engines.pool import EnginePool
from tito.engines.sglang import SGLangEngine
from tito.engines.transport import HttpTransport
from tito.render.base import TemplateRenderer
from tito.server.gateway import Gateway
from tito.types.engine import EngineStats, MemberStats, SamplingParams
from tito.types.errors import EngineRefused, EngineUnreachable
from tito.types.placement import session_of

PARAMS = SamplingParams(max_new_tokens=8)


def pool_of(renderer: TemplateRenderer, n: int, **kw: Any) -> tuple[EnginePool,
                                                                       list[FakeEngine]]:
    engines = [FakeEngine(renderer) for _ in range(n)]
    return EnginePool([(f"http://e{i}", e) for i, e in enumerate(engines)], **kw), engines


def test_request_ids_name_their_session() -> None:
    assert session_of("0123abcd_t000002_ff00aa11") == "0123abcd"
    assert session_of("foreign-id") == "foreign-id"


async def test_sessions_spread_then_stick(qwen3_renderer: TemplateRenderer) -> None:
    pool, engines = pool_of(qwen3_renderer, 2)
    for turn, session in itertools.product(range(3), "abcd"):
        await pool.generate([1, 2, 3], PARAMS, f"{session}_t{turn:06d}_00")
    where = {s: {i for i, e in enumerate(engines) for c in e.calls if session_of(c.rid) == s}
             for s in "abcd"}
    assert all(len(w) == 1 for w in where.values()), where  # every turn on one engine
    assert sorted(len(e.calls) for e in engines) == [6, 6]  # two sessions each
    stats = pool.member_stats()
    assert [stats[u]["sessions"] for u in ("http://e0", "http://e1")] == [2, 2]


async def test_a_failed_engine_is_ejected_the_session_moves_and_it_comes_back(
        qwen3_renderer: TemplateRenderer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tito.engines.pool.PROBE_EVERY_S", 0.0)
    pool, (first, second) = pool_of(qwen3_renderer, 2)
    await pool.generate([1], PARAMS, "s_t000000_00")
    assert first.calls  # placed on the first (least loaded, first in order)
    first.script(EngineUnreachable("connection refused"))
    first.down = "connection refused"
    with pytest.raises(EngineUnreachable):
        await pool.generate([1], PARAMS, "s_t000001_00")
    assert pool.member_stats()["http://e0"]["up"] == 0.0
    await pool.generate([1], PARAMS, "s_t000001_01")  # the retry moves
    assert second.calls[-1].rid == "s_t000001_01" and pool.moves == 1
    assert await pool.probe() is None  # one engine up: the pool is up
    first.down = None  # it answers again: re-admitted, and new sessions use it
    await pool.generate([1], PARAMS, "t_t000000_00")
    assert first.calls[-1].rid == "t_t000000_00"


async def test_a_refused_connection_moves_the_turn_at_once(
        qwen3_renderer: TemplateRenderer) -> None:
    """Nothing reached the engine: the same request runs on another engine, no failed
    turn; the session then sticks there. Streamed turns move alike."""
    pool, (first, second) = pool_of(qwen3_renderer, 2)
    await pool.generate([1], PARAMS, "s_t000000_00")
    await pool.generate([1], PARAMS, "u_t000000_00")  # on the second (least loaded)
    first.script(EngineRefused("connection refused"))
    first.down = "connection refused"
    result = await pool.generate([1, 2], PARAMS, "s_t000001_00")
    assert result.output_ids and second.calls[-1].rid == "s_t000001_00"
    assert pool.refused_moves == 1 and pool.moves == 1
    assert pool.member_stats()["http://e0"]["up"] == 0.0
    await pool.generate([1], PARAMS, "s_t000002_00")
    assert second.calls[-1].rid == "s_t000002_00"  # sticks to its new engine
    second.script(EngineRefused("refused"))
    second.down = "refused"  # the last engine refuses: the refusal is the turn's error
    with pytest.raises(EngineRefused, match="refused"):
        await pool.generate([1], PARAMS, "s_t000003_00")


async def test_a_refused_stream_moves_before_its_first_chunk(
        qwen3_renderer: TemplateRenderer) -> None:
    pool, (first, second) = pool_of(qwen3_renderer, 2)
    first.script(EngineRefused("connection refused"))
    chunks = [c async for c in pool.generate_stream([1], PARAMS, "s_t000000_00")]
    assert chunks[-1].result is not None and [c.rid for c in second.calls] == ["s_t000000_00"]
    assert pool.refused_moves == 1


async def test_the_transport_maps_a_refused_connection() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    transport = HttpTransport(f"http://127.0.0.1:{sock.getsockname()[1]}")
    try:
        with pytest.raises(EngineRefused, match="engine transport error"):
            await transport.request("POST", "/generate", b"{}")
    finally:
        await transport.close()
        sock.close()


async def test_all_down_is_an_engine_error_naming_each(qwen3_renderer: TemplateRenderer
                                                       ) -> None:
    pool, engines = pool_of(qwen3_renderer, 2)
    for engine in engines:
        engine.down = "gone"
    assert await pool.probe() == "http://e0: gone; http://e1: gone"
    with pytest.raises(Exception, match="no engine is up"):
        await pool.generate([1], PARAMS, "s_t000000_00")


async def test_inflight_cap_queues_and_aborts_reach_the_running_engine(
        qwen3_renderer: TemplateRenderer) -> None:
    pool, (engine,) = pool_of(qwen3_renderer, 1, max_inflight=1)
    engine.gate = asyncio.Event()
    first = asyncio.create_task(pool.generate([1], PARAMS, "a_t000000_00"))
    second = asyncio.create_task(pool.generate([1], PARAMS, "b_t000000_00"))
    await asyncio.sleep(0.05)
    assert [c.rid for c in engine.calls] == ["a_t000000_00"]  # b waits for a slot
    await pool.abort("a_t000000_00")
    assert engine.aborted == ["a_t000000_00"]
    engine.gate.set()
    await asyncio.gather(first, second)
    await pool.abort("a_t000000_00")  # finished: nothing to abort
    assert engine.aborted == ["a_t000000_00"]


async def test_weight_versions_and_pauses_reach_every_engine(
        qwen3_renderer: TemplateRenderer) -> None:
    pool, engines = pool_of(qwen3_renderer, 3)
    await pool.update_weight_version("v7")
    assert [e.weight_version for e in engines] == ["v7"] * 3


async def test_stats_of_a_pool(qwen3_renderer: TemplateRenderer) -> None:
    """One engine to the gateway: the first engine's URL, the stale retries of all of
    them, each engine's figures (the same ones member_stats gives /metrics)."""
    pool, engines = pool_of(qwen3_renderer, 2)
    engines[0].stale_retries, engines[1].stale_retries = 2, 3
    await pool.generate([1, 2, 3], PARAMS, "a_t000000_00")
    stats = pool.stats()
    assert (stats.name, stats.url, stats.stale_retries) == ("pool", "http://e0", 5)
    assert stats.members == (
        MemberStats("http://e0", True, 0, 1, requests=1, prompt_tokens=3),
        MemberStats("http://e1", True, 0, 0))
    assert stats.member_figures() == pool.member_stats()
    assert EngineStats("fake").member_figures() is None  # a single engine: no members


@pytest.fixture
async def pool_gateway(qwen3_dir: Path, qwen3_renderer: TemplateRenderer,
                       qwen3_self_check: dict[str, Any],
                       serve: Callable[..., Awaitable[str]]
                       ) -> tuple[Gateway, list[str]]:
    """The real app in this process over a pool of two real mock engines (HTTP)."""
    mocks = [MockEngine(MockConfig(tokenizer_dir=str(qwen3_dir), family="qwen3"),
                        MockModel(qwen3_renderer)) for _ in range(2)]
    urls = [await serve(m.app()) for m in mocks]
    config = ServerConfig(tokenizer=str(qwen3_dir), family="qwen3", engine="sglang",
                          engine_url=urls[0], extra_engine_urls=(urls[1],))
    pool = EnginePool([(url, SGLangEngine(url)) for url in urls])
    return Gateway(config, qwen3_renderer, pool, self_check=qwen3_self_check), urls


async def test_health_and_metrics_behind_a_pool_keep_the_url_and_stale_retries(
        pool_gateway: tuple[Gateway, list[str]]) -> None:
    """Behind several engines /metrics still exports tito_engine_stale_retries_total (the
    sum over the engines) and /health names an engine URL (the first one)."""
    gateway, urls = pool_gateway
    assert isinstance(gateway.engine, EnginePool)
    members = [m.engine for m in gateway.engine.members]
    try:
        async with asgi_client(gateway) as http:
            sid = await new_session(http)
            resp = await http.post(f"/sessions/{sid}/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "SAY hi"}]})
            assert resp.status_code == 200, resp.text
            for member, retries in zip(members, (2, 3), strict=True):
                assert isinstance(member, SGLangEngine)
                member.http.stale_retries = retries
            health = (await http.get("/health")).json()
            metrics = (await http.get("/metrics")).text
    finally:
        await gateway.engine.close()
    assert health["engine"]["url"] == urls[0]
    assert [e["url"] for e in health["engine"]["engines"]] == urls
    assert [e["up"] for e in health["engine"]["engines"]] == [True, True]
    assert "tito_engine_stale_retries_total 5" in metrics.splitlines()
    assert sum(f'tito_engine_requests_total{{engine="{url}"}} 1' in metrics
               for url in urls) == 1


# -- real processes ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_engines() -> Iterator[tuple[list[Proc], Proc]]:
    tokenizer = tokenizer_dir("qwen3")
    engines = [start_mock(tokenizer, "qwen3") for _ in range(2)]
    gateway = None
    try:
        gateway = start_gateway(engines[0].url, tokenizer, "qwen3",
                                "--engine-url", engines[1].url)
        yield engines, gateway
    finally:
        if gateway is not None:
            gateway.stop()
        for engine in engines:
            engine.stop()


@pytest.mark.slow
def test_two_engines_behind_one_gateway(two_engines: tuple[list[Proc], Proc]) -> None:
    engines, gateway = two_engines
    sids = [httpx.post(gateway.url + "/sessions").json()["session_id"] for _ in range(4)]
    histories: dict[str, list[dict[str, Any]]] = {sid: [] for sid in sids}
    for turn, sid in itertools.product(range(2), sids):
        client = openai.OpenAI(base_url=f"{gateway.url}/sessions/{sid}/v1", api_key="x",
                               max_retries=0)
        histories[sid].append({"role": "user", "content": f"SAY turn {turn}."})
        reply = client.chat.completions.create(model="m", messages=histories[sid])  # type: ignore[arg-type]
        histories[sid].append(reply.choices[0].message.model_dump(exclude_none=True))
    logs = [httpx.get(e.url + "/mock/requests").json() for e in engines]
    for sid in sids:  # each session on one engine, its turns in the TITO chain
        runs = [[r for r in log if r["rid"].startswith(sid)] for log in logs]
        (mine,) = [r for r in runs if r]
        stored = mine[0]["input_ids"] + mine[0]["output_ids"]
        assert mine[1]["input_ids"][: len(stored)] == stored
    assert sorted(len(log) for log in logs) == [4, 4]
    health = httpx.get(gateway.url + "/health").json()
    assert [e["up"] for e in health["engine"]["engines"]] == [True, True]
    metrics = httpx.get(gateway.url + "/metrics").text
    for engine in engines:
        assert f'tito_engine_requests_total{{engine="{engine.url}"}} 4' in metrics
        assert f'tito_engine_cache_hit_rate{{engine="{engine.url}"}}' in metrics

    # an engine dies (its port refuses connections): its sessions' next turns move to the
    # other engine at once, with no failed turn (nothing had reached the dead engine)
    engines[0].stop()
    moved = [sid for sid in sids if any(r["rid"].startswith(sid) for r in logs[0])]
    sid = moved[0]
    client = openai.OpenAI(base_url=f"{gateway.url}/sessions/{sid}/v1", api_key="x",
                           max_retries=0)
    messages = [*histories[sid], {"role": "user", "content": "SAY Still here."}]
    reply = client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "Still here."
    last = httpx.get(engines[1].url + "/mock/requests").json()[-1]
    assert last["rid"].startswith(sid)  # served by the survivor, from the gateway's ids
    meta = httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]
    assert meta["num_turns"] == 3
    health = httpx.get(gateway.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert [e["up"] for e in health.json()["engine"]["engines"]] == [False, True]
    assert "tito_errors_total{" not in httpx.get(gateway.url + "/metrics").text  # no 502


@pytest.mark.slow
def test_a_reset_after_the_request_was_sent_stays_a_502() -> None:
    """The engine may have generated: the turn fails (the session unchanged) rather than
    run again on the other engine."""
    tokenizer = tokenizer_dir("qwen3")
    engines = [start_mock(tokenizer, "qwen3") for _ in range(2)]
    gateway = None
    try:
        gateway = start_gateway(engines[0].url, tokenizer, "qwen3",
                                "--engine-url", engines[1].url)
        sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
        client = openai.OpenAI(base_url=f"{gateway.url}/sessions/{sid}/v1", api_key="x",
                               max_retries=0)
        first = [{"role": "user", "content": "SAY One."}]
        reply = client.chat.completions.create(model="m", messages=first)  # type: ignore[arg-type]
        history = [*first, reply.choices[0].message.model_dump(exclude_none=True)]
        logs = [engine_log(e.url, sid) for e in engines]
        (home,) = [i for i, log in enumerate(logs) if log]
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model="m", messages=[  # type: ignore[arg-type]
                *history, {"role": "user", "content": "FAULT reset\nSAY Two."}])
        assert failed.value.status_code == 502
        assert failed.value.body["code"] == "engine_error"  # type: ignore[index]
        assert len(engine_log(engines[home].url, sid)) >= 2  # it reached the engine ...
        assert engine_log(engines[1 - home].url, sid) == []  # ... and was not run again
        meta = httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]
        assert meta["num_turns"] == 1
    finally:
        if gateway is not None:
            gateway.stop()
        for engine in engines:
            engine.stop()


def test_engines_of_both_kinds_serve_side_by_side() -> None:
    from tito.config import ServerConfig
    from tito.engines.sglang import SGLangEngine
    from tito.engines.vllm import VLLMEngine
    from tito.stack import build_engine

    config = ServerConfig(tokenizer="t", engine="sglang", engine_url="http://a:1",
                          extra_engine_urls=("vllm+http://b:2", "sglang+http://c:3"))
    config.validate()
    pool = build_engine(config)
    assert isinstance(pool, EnginePool)
    assert [(m.url, type(m.engine)) for m in pool.members] == [
        ("http://a:1", SGLangEngine), ("http://b:2", VLLMEngine), ("http://c:3", SGLangEngine)]
