"""MoE routing replay (R3) and indexer top-k replay end to end: the real `tito
mock-engine` serving routed experts and indexer rows over its SGLang wire, the gateway
(in-process, its SGLang client) asking for them in full (`retract`) or incremental
(`in_place`, `abort`) mode, v1 retries and v2 branches, truncation, and a one-shot
"prefill oracle": the mock's rows are a function of (token, position, layer) only, so
every assembled row can be recomputed from the sample's tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from helpers.inproc import asgi_client, new_session
from helpers.support import Proc, start_mock

from tito.config import ServerConfig
from tito.engines.mock.replies import indexer_rows, routing_rows
from tito.engines.sglang import SGLangEngine
from tito.render.base import TemplateRenderer
from tito.samples import decode_samples
from tito.samples.sample import Sample
from tito.server.gateway import Gateway

LAYERS, TOPK, EXPERTS = 3, 2, 8
INDEXER_LAYERS, INDEXER_TOPK = 2, 3


pytestmark = pytest.mark.slow  # real mock processes with replay/latency: the slow tier

@pytest.fixture(scope="module")
def routing_mock(qwen3_dir: Path) -> Iterator[Proc]:
    engine = start_mock(qwen3_dir, "qwen3", "--enable-return-routed-experts",
                        "--num-layers", str(LAYERS), "--topk", str(TOPK),
                        "--num-experts", str(EXPERTS), "--enable-return-indexer-topk",
                        "--indexer-layers", str(INDEXER_LAYERS), "--indexer-topk",
                        str(INDEXER_TOPK))
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture
async def make(routing_mock: Proc, qwen3_dir: Path, qwen3_renderer: TemplateRenderer,
               qwen3_self_check: dict[str, Any]) -> AsyncIterator[Any]:
    gateways: list[Gateway] = []

    def build(**config: Any) -> Gateway:
        config.setdefault("indexer_replay", True)
        cfg = ServerConfig(tokenizer=str(qwen3_dir), family="qwen3", engine="sglang",
                           engine_url=routing_mock.url, routing_replay=True,
                           routing_layers=LAYERS, **config)
        cfg.validate()
        engine = SGLangEngine(routing_mock.url, vocab_size=qwen3_renderer.tokenizer.vocab_size)
        gateway = Gateway(cfg, qwen3_renderer, engine, self_check=qwen3_self_check)
        gateways.append(gateway)
        return gateway

    yield build
    for gateway in gateways:
        await gateway.engine.close()


@pytest.fixture
async def mock_log(routing_mock: Proc) -> AsyncIterator[Any]:
    async with httpx.AsyncClient(base_url=routing_mock.url) as http:
        await http.delete("/mock/requests")

        async def read() -> list[dict[str, Any]]:
            return list((await http.get("/mock/requests")).json())

        yield read


def oracle(sample: Sample) -> np.ndarray:
    """The one-shot prefill's routing of the sample's tokens; its indexer rows are checked
    on the way."""
    assert sample.rollout_indexer_topk is not None
    indexer = indexer_rows(sample.tokens.tolist(), 0, layers=INDEXER_LAYERS,
                           topk=INDEXER_TOPK)
    assert np.array_equal(sample.rollout_indexer_topk, indexer)
    return routing_rows(sample.tokens.tolist(), 0, layers=LAYERS, topk=TOPK, experts=EXPERTS)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def chat(http: httpx.AsyncClient, sid: str, messages: list[Any],
               **body: Any) -> dict[str, Any]:
    resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                           json={"messages": messages, **body})
    assert resp.status_code == 200, resp.text
    assert "routed_experts" not in resp.text  # never in the agent's reply
    return dict(resp.json()["choices"][0]["message"])


async def conversation(http: httpx.AsyncClient, sid: str) -> None:
    """Four turns with a retry of the third."""
    msgs: list[Any] = [user("hi\nSAY hello there")]
    msgs += [await chat(http, sid, msgs), user("more\nSAY some more words")]
    msgs += [await chat(http, sid, msgs), user("again\nSAY again")]
    await chat(http, sid, msgs)
    msgs += [await chat(http, sid, msgs), user("last\nSAY done")]  # the retry
    await chat(http, sid, msgs)


@pytest.mark.parametrize(("mode", "incremental"), [("retract", False), ("in_place", True),
                                                   ("abort", True)])
async def test_v1_rows_match_the_prefill_oracle(make: Any, mock_log: Any, mode: str,
                                                incremental: bool) -> None:
    gateway = make(pause_generation_mode=mode)
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        await conversation(http, sid)
        [sample] = decode_samples((await http.post(f"/sessions/{sid}/samples")).content).samples
        health = (await http.get("/health")).json()
    r3 = sample.rollout_routed_experts
    assert r3 is not None and r3.dtype == np.int32
    assert r3.shape == (len(sample.tokens) - 1, LAYERS, TOPK)
    assert np.array_equal(r3, oracle(sample))
    starts = [entry["routed_experts_start_len"] for entry in await mock_log()]
    assert health["routing_replay"]["incremental"] is incremental
    if incremental:  # each turn asks only for the rows after its stored prefix
        assert starts[0] == 0 and all(s > 0 for s in starts[1:3])
        assert starts[3] == starts[2]  # the retry asks again from the same prefix
    else:
        assert starts == [0] * 5


async def test_incremental_stores_each_row_once(make: Any) -> None:
    gateway = make(pause_generation_mode="in_place")
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        msgs: list[Any] = [user("go\nSAY ok")]
        for k in range(6):
            msgs += [await chat(http, sid, msgs), user(f"turn {k}\nSAY fine")]
        session = gateway.session(sid)
        stored = sum(r.routed_experts.shape[0] for r in session.records  # type: ignore[union-attr]
                     if r.routed_experts is not None)
        assert stored == session.num_tokens - 1  # rows grow with tokens, not turns squared
        indexed = sum(r.indexer_topk.shape[0] for r in session.records  # type: ignore[union-attr]
                      if r.indexer_topk is not None)
        assert indexed == stored


async def test_truncation_trims_rows_in_lockstep(make: Any) -> None:
    async with asgi_client(make(pause_generation_mode="in_place")) as http:
        sid = await new_session(http)
        msgs: list[Any] = [user("hi\nSAY hello there")]
        msgs += [await chat(http, sid, msgs), user("more\nSAY some more words")]
        await chat(http, sid, msgs)
        full = decode_samples((await http.post(f"/sessions/{sid}/samples")).content)
        limit = len(full.samples[0].tokens) - 3
        cut = decode_samples((await http.post(f"/sessions/{sid}/samples",
                                              json={"max_seq_len": limit})).content)
    [sample] = cut.samples
    assert len(sample.tokens) == limit and sample.status == "truncated"
    assert np.array_equal(sample.rollout_routed_experts, oracle(sample))  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["retract", "in_place"])
async def test_v2_branches_keep_their_own_rows(make: Any, mode: str) -> None:
    async with asgi_client(make(session_version="v2", pause_generation_mode=mode)) as http:
        sid = await new_session(http)
        a0 = await chat(http, sid, [user("root\nSAY root answer")])
        a1 = await chat(http, sid, [user("root\nSAY root answer"), a0, user("left\nSAY L")])
        await chat(http, sid, [user("root\nSAY root answer"), a0, user("left\nSAY L"), a1,
                               user("deeper\nSAY D")])
        await chat(http, sid, [user("root\nSAY root answer"), a0, user("right\nSAY R")])
        samples = decode_samples((await http.post(f"/sessions/{sid}/samples")).content).samples
    assert [s.metadata["leaf"]["path_node_ids"] for s in samples] == [[0, 1, 2], [0, 3]]
    for sample in samples:
        assert np.array_equal(sample.rollout_routed_experts, oracle(sample))  # type: ignore[arg-type]


async def test_missing_payload_is_422_naming_the_turn(qwen3_dir: Path,
                                                      qwen3_renderer: TemplateRenderer,
                                                      qwen3_stack: Any) -> None:
    """An engine that does not return routed experts (no --enable-return-routed-experts):
    turns are served, the collection says what is missing."""
    engine_proc, _ = qwen3_stack
    cfg = ServerConfig(tokenizer=str(qwen3_dir), family="qwen3", engine="sglang",
                       engine_url=engine_proc.url, routing_replay=True, routing_layers=LAYERS,
                       indexer_replay=True)
    gateway = Gateway(cfg, qwen3_renderer, SGLangEngine(engine_proc.url))
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        await chat(http, sid, [user("hi\nSAY hello")])
        resp = await http.post(f"/sessions/{sid}/samples")
    await gateway.engine.close()
    assert resp.status_code == 422
    message = resp.json()["error"]["message"]
    assert "record 0 (turn 0) has no routed_experts payload" in message
    assert "--enable-return-routed-experts" in message


async def test_journal_keeps_the_rows(make: Any, tmp_path: Path) -> None:
    first = make(pause_generation_mode="in_place", journal=str(tmp_path))
    async with asgi_client(first) as http:
        sid = await new_session(http)
        await conversation(http, sid)
        before = (await http.post(f"/sessions/{sid}/samples")).content
    assert first.journal is not None
    first.journal.close()
    second = make(pause_generation_mode="in_place", journal=str(tmp_path))
    async with asgi_client(second) as http:
        after = (await http.post(f"/sessions/{sid}/samples")).content
    [a], [b] = decode_samples(before).samples, decode_samples(after).samples
    assert np.array_equal(a.rollout_routed_experts, b.rollout_routed_experts)  # type: ignore[arg-type]
    assert np.array_equal(a.rollout_indexer_topk, b.rollout_indexer_topk)  # type: ignore[arg-type]


async def test_routing_without_indexer(make: Any) -> None:
    """Indexer replay off: no indexer rows are asked for or kept."""
    async with asgi_client(make(pause_generation_mode="in_place",
                                indexer_replay=False)) as http:
        sid = await new_session(http)
        await chat(http, sid, [user("hi\nSAY hello")])
        [sample] = decode_samples((await http.post(f"/sessions/{sid}/samples")).content).samples
    assert sample.rollout_indexer_topk is None and sample.rollout_routed_experts is not None
