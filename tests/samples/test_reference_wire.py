"""Wire compatibility with the reference framework's samples payload, both ways.

``reference_decode`` is written from the reference's published wire spec (its samples
value spec: tensor fields with pinned dtypes, ``nulls`` for absent tensors, the JSON keys
it reads, unreferenced tensors refused) — not from our codec. A payload from the real
gateway must pass it; a payload in the reference layout (no ``format_version``, no
``reward`` on v1) must pass ours.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
from helpers.fakes import ModelEngine
from helpers.inproc import asgi_client, new_session

from tito.config import ServerConfig
from tito.render.base import TemplateRenderer
from tito.samples import decode_samples
from tito.server.gateway import Gateway

TENSORS = {"tokens": np.int64, "loss_mask": np.uint8, "rollout_log_probs": np.float64,
           "rollout_routed_experts": np.int32, "rollout_indexer_topk": np.int32}
STRICT = {"rollout_routed_experts", "rollout_indexer_topk"}
JSON_KEYS = ("response", "response_length", "status", "weight_versions",
             "prefix_cache_info", "metadata")
STATUS_VALUES = {"pending", "completed", "truncated", "aborted", "failed"}


def reference_decode(payload: bytes, *, v2: bool = False) -> list[dict[str, Any]]:
    """The reference driver's checks, field by field, from its spec."""
    tensors = safetensors.numpy.load(payload)
    meta_arr = tensors.pop("_samples_meta")
    assert meta_arr.ndim == 1 and meta_arr.dtype == np.uint8
    meta = json.loads(meta_arr.tobytes().decode("utf-8"))
    out = []
    for index, entry in enumerate(meta["samples"]):
        nulls = set(entry["nulls"])
        assert nulls <= set(TENSORS), f"null markers reference non-tensor fields: {nulls}"
        sample: dict[str, Any] = {}
        for key in JSON_KEYS:
            sample[key] = entry[key]  # a KeyError here is what the reference raises
        assert sample["status"] in STATUS_VALUES
        assert set(sample["prefix_cache_info"]) >= {"cached_tokens", "total_prompt_tokens"}
        assert isinstance(sample["metadata"], dict)
        if v2:
            sample["reward"] = entry["reward"]
        for field, dtype in TENSORS.items():
            if field in nulls:
                sample[field] = None
                continue
            arr = tensors.pop(f"{field}.{index}")
            assert arr.dtype == np.dtype(dtype), f"{field} must have dtype {dtype}"
            sample[field] = arr if field in STRICT else arr.tolist()
        out.append(sample)
    assert not tensors, f"payload carries unreferenced tensors: {sorted(tensors)}"
    return out


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_the_reference_spec_decodes_our_payload(
        version: str, qwen3_renderer: TemplateRenderer, qwen3_dir: Path,
        qwen3_self_check: dict[str, Any]) -> None:
    cfg = ServerConfig(tokenizer=str(qwen3_dir), family="qwen3", engine="sglang",
                       engine_url="http://fake", session_version=version)
    gateway = Gateway(cfg, qwen3_renderer, ModelEngine(qwen3_renderer),
                      self_check=qwen3_self_check)
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        msgs: list[Any] = [{"role": "user", "content": "hi\nSAY hello there"}]
        r = await http.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": msgs})
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "more\nSAY ok"}]
        await http.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": msgs})
        payload = (await http.post(f"/sessions/{sid}/samples")).content
    [sample] = reference_decode(payload, v2=version == "v2")
    ours = decode_samples(payload).samples[0]
    assert sample["tokens"] == ours.tokens.tolist()
    assert sample["rollout_log_probs"] == ours.rollout_log_probs.tolist()  # type: ignore[union-attr]
    assert sample["status"] == "completed"
    lifecycle = sample["metadata"]["lifecycle"]
    assert [seg["turn"] for seg in lifecycle] == [1, 2] and "prev_t1" in lifecycle[1]
    info = sample["prefix_cache_info"]
    assert info["total_prompt_tokens"] == sum(
        rec.prompt_len for rec in gateway.session(sid).records)
    assert sample["metadata"]["max_trim_tokens"] == 0


def test_our_decoder_reads_the_reference_layout() -> None:
    """A v1 payload as the reference server writes it: no format_version, no reward,
    statuses of its enum, indexer top-k as a tensor."""
    tokens = np.array([1, 2, 3, 4, 5], np.int64)
    meta = {"samples": [{
        "response": "x", "response_length": 2, "status": "failed", "weight_versions": ["w"],
        "prefix_cache_info": {"cached_tokens": 2, "total_prompt_tokens": 3},
        "metadata": {"tito_session_mismatch": []}, "nulls": ["rollout_routed_experts"]}],
        "session_metadata": {"max_trim_tokens": 0}, "empty_reason": None}
    payload = safetensors.numpy.save({
        "tokens.0": tokens, "loss_mask.0": np.ones(2, np.uint8),
        "rollout_log_probs.0": np.array([-0.5, -0.25]),
        "rollout_indexer_topk.0": np.zeros((4, 2, 3), np.int32),
        "_samples_meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)})
    [sample] = decode_samples(payload).samples
    assert sample.status == "failed" and sample.reward is None
    assert sample.prefix_cache_info == {"cached_tokens": 2, "total_prompt_tokens": 3}
    assert sample.rollout_indexer_topk is not None and sample.rollout_indexer_topk.shape == \
        (4, 2, 3)
    assert sample.rollout_routed_experts is None
