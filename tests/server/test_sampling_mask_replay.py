"""Sampling-mask replay end to end: the real `tito mock-engine` returning the kept token
set of every generated position (SGLang ``return_sampling_mask``,
``meta_info.output_token_sampling_mask``), the gateway (in-process, its SGLang client)
storing them per turn and assembling ``rollout_sampling_mask`` (int32 ids) and
``rollout_sampling_mask_offsets`` (int64) over v1 retries, v2 branches and max_seq_len
truncation, checked against an oracle: the mock's kept sets are a function of (token,
position) only, so every response position's set is recomputed from the sample's
tokens (bridge positions keep none)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from helpers.inproc import asgi_client, new_session
from helpers.support import Proc

from tito.config import ServerConfig
from tito.engines.mock.replies import sampling_mask_sets
from tito.engines.sglang import SGLangEngine
from tito.render.base import TemplateRenderer
from tito.samples import decode_samples
from tito.samples.sample import Sample
from tito.server.gateway import Gateway
from tito.types.errors import ConfigError

TOP_K = 3


@pytest.fixture
async def make(qwen3_stack: tuple[Proc, Proc], qwen3_dir: Path,
               qwen3_renderer: TemplateRenderer,
               qwen3_self_check: dict[str, Any]) -> AsyncIterator[Any]:
    engine_proc, _ = qwen3_stack
    gateways: list[Gateway] = []

    def build(**config: Any) -> Gateway:
        config.setdefault("sampling_mask_replay", True)
        cfg = ServerConfig(tokenizer=str(qwen3_dir), family="qwen3", engine="sglang",
                           engine_url=engine_proc.url, **config)
        cfg.validate()
        engine = SGLangEngine(engine_proc.url,
                              vocab_size=qwen3_renderer.tokenizer.vocab_size)
        gateway = Gateway(cfg, qwen3_renderer, engine, self_check=qwen3_self_check)
        gateways.append(gateway)
        return gateway

    yield build
    for gateway in gateways:
        await gateway.engine.close()


def generated(sample: Sample) -> list[bool]:
    """Which response positions were generated: v2 tells by its completion spans (its
    loss mask trains a shared prefix once), v1 by its loss mask."""
    prompt = len(sample.tokens) - sample.response_length
    leaf = sample.metadata.get("leaf")
    if leaf is None:
        assert sample.loss_mask is not None
        return [bool(v) for v in sample.loss_mask.tolist()]
    flags = [False] * sample.response_length
    for _, start, end in leaf["completion_spans"]:
        for pos in range(start, end):
            flags[pos - prompt] = True
    return flags


def oracle(sample: Sample, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The kept ids and offsets the mock's sets give the sample's response region: the
    set of every generated id, none on bridge ids."""
    prompt = len(sample.tokens) - sample.response_length
    sets: list[list[int]] = []
    for i, trained in enumerate(generated(sample)):
        pos = prompt + i
        tok = int(sample.tokens[pos])
        sets.append(sampling_mask_sets([tok], pos, vocab=vocab, top_k=TOP_K)[0]
                    if trained else [])
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sets])]).astype(np.int64)
    return np.array([t for s in sets for t in s], dtype=np.int32), offsets


def check(sample: Sample, vocab: int) -> None:
    ids, offsets = sample.rollout_sampling_mask, sample.rollout_sampling_mask_offsets
    assert ids is not None and offsets is not None
    assert ids.dtype == np.int32 and offsets.dtype == np.int64
    assert len(offsets) == sample.response_length + 1
    want_ids, want_offsets = oracle(sample, vocab)
    assert np.array_equal(offsets, want_offsets)
    assert np.array_equal(ids, want_ids)
    assert (np.diff(offsets)[np.array(generated(sample))] >= 1).all()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def chat(http: httpx.AsyncClient, sid: str, messages: list[Any],
               **body: Any) -> dict[str, Any]:
    body.setdefault("top_k", TOP_K)
    resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                           json={"messages": messages, **body})
    assert resp.status_code == 200, resp.text
    assert "sampling_mask" not in resp.text  # never in the agent's reply
    return dict(resp.json()["choices"][0]["message"])


async def samples(http: httpx.AsyncClient, sid: str, **body: Any) -> list[Sample]:
    resp = await http.post(f"/sessions/{sid}/samples", json=body or None)
    assert resp.status_code == 200, resp.text
    return decode_samples(resp.content).samples


async def test_v1_retry_and_truncation_match_the_oracle(make: Any, qwen3_renderer: Any) -> None:
    vocab = qwen3_renderer.tokenizer.vocab_size
    async with asgi_client(make()) as http:
        sid = await new_session(http)
        msgs: list[Any] = [user("hi\nSAY hello there")]
        msgs += [await chat(http, sid, msgs), user("more\nSAY some more words")]
        await chat(http, sid, msgs)
        msgs += [await chat(http, sid, msgs), user("last\nSAY done")]  # a retry of turn 1
        streamed = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                   json={"messages": msgs, "top_k": TOP_K, "stream": True})
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
        [full] = await samples(http, sid)
        assert len(full.metadata["lifecycle"]) == 3  # turn 1 retried, turn 2 streamed
        assert (await http.get("/health")).json()["sampling_mask_replay"] is True
        check(full, vocab)
        [cut] = await samples(http, sid, max_seq_len=len(full.tokens) - 2)
    assert cut.status == "truncated" and len(cut.tokens) == len(full.tokens) - 2
    check(cut, vocab)
    assert np.array_equal(cut.rollout_sampling_mask_offsets,
                          full.rollout_sampling_mask_offsets[:cut.response_length + 1])  # type: ignore[index]


async def test_v2_branches_keep_their_own_sets(make: Any, qwen3_renderer: Any) -> None:
    vocab = qwen3_renderer.tokenizer.vocab_size
    async with asgi_client(make(session_version="v2")) as http:
        sid = await new_session(http)
        root = [user("root\nSAY root answer")]
        a0 = await chat(http, sid, root)
        a1 = await chat(http, sid, [*root, a0, user("left\nSAY L")])
        await chat(http, sid, [*root, a0, user("left\nSAY L"), a1, user("deeper\nSAY D")])
        await chat(http, sid, [*root, a0, user("right\nSAY R")])
        got = await samples(http, sid)
    assert [s.metadata["leaf"]["path_node_ids"] for s in got] == [[0, 1, 2], [0, 3]]
    for sample in got:
        check(sample, vocab)


async def test_feature_off_leaves_no_field(make: Any) -> None:
    async with asgi_client(make(sampling_mask_replay=False)) as http:
        sid = await new_session(http)
        await chat(http, sid, [user("hi\nSAY hello")])
        resp = await http.post(f"/sessions/{sid}/samples")
    assert b"rollout_sampling_mask" not in resp.content
    [sample] = decode_samples(resp.content).samples
    assert sample.rollout_sampling_mask is None and sample.rollout_sampling_mask_offsets is None


async def test_untruncated_sampling_is_400_and_changes_nothing(make: Any) -> None:
    gateway = make()
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        resp = await http.post(f"/sessions/{sid}/v1/chat/completions",
                               json={"messages": [user("hi\nSAY x")], "top_k": -1,
                                     "top_p": 1.0, "temperature": 1.0})
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["code"] == "sampling_mask_untruncated" and "top_p" in error["message"]
        assert gateway.session(sid).records == []
        await chat(http, sid, [user("hi\nSAY x")], top_k=-1, top_p=0.9)  # top-p alone: fine
        await chat(http, sid, [user("hi\nSAY x")], temperature=0.0, top_k=-1)  # greedy


async def test_journal_keeps_the_sets(make: Any, tmp_path: Path) -> None:
    first = make(journal=str(tmp_path))
    async with asgi_client(first) as http:
        sid = await new_session(http)
        msgs: list[Any] = [user("hi\nSAY hello there")]
        msgs += [await chat(http, sid, msgs), user("more\nSAY words")]
        await chat(http, sid, msgs)
        [before] = await samples(http, sid)
    assert first.journal is not None
    first.journal.close()
    async with asgi_client(make(journal=str(tmp_path))) as http:
        [after] = await samples(http, sid)
    assert np.array_equal(before.rollout_sampling_mask, after.rollout_sampling_mask)  # type: ignore[arg-type]
    assert np.array_equal(before.rollout_sampling_mask_offsets,  # type: ignore[arg-type]
                          after.rollout_sampling_mask_offsets)


@pytest.mark.parametrize("engine", ["embedded", "vllm"])
def test_engines_without_masks_are_refused(engine: str, qwen3_dir: Path) -> None:
    remote: dict[str, Any] = {"engine_url": "http://127.0.0.1:9", "family": "qwen3",
                              "tokenizer": str(qwen3_dir)} if engine == "vllm" else \
        {"tokenizer": None}
    cfg = ServerConfig(engine=engine, sampling_mask_replay=True, **remote)
    with pytest.raises(ConfigError, match="--sampling-mask-replay") as info:
        cfg.validate()
    if engine == "vllm":
        assert "/inference/v1/generate" in str(info.value)
