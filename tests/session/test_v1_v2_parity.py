"""v1 and v2 (default picker and postprocessor) give the same training sample, bit for
bit, for linear agents with retries: 16 concurrent scripted weather agents x 9 requests
(two tool calls, a user follow-up, two consecutive retries, a system reminder, an
injected assistant note) through the openai SDK on the real app in-process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers.fakes import ModelEngine
from helpers.inproc import asgi_client, new_session
from helpers.scripted import WEATHER_TOOLS, WEATHER_TREE, first_turn_retry, weather_agent

from tito.config import ServerConfig
from tito.render.base import TemplateRenderer
from tito.samples import decode_samples
from tito.samples.sample import Sample, samples_identical
from tito.server.gateway import Gateway

AGENTS = 16
AGENT_METADATA = {"task": "weather", "score": 3}


def make(renderer: TemplateRenderer, qwen3_dir: Path, self_check: dict[str, Any],
         version: str) -> Gateway:
    cfg = ServerConfig(tokenizer=str(qwen3_dir), family="qwen3", engine="sglang",
                       engine_url="http://fake", session_version=version)
    cfg.validate()
    return Gateway(cfg, renderer, ModelEngine(renderer), self_check=self_check)


async def run_agent(http: httpx.AsyncClient, agent: int, script: Any = weather_agent
                    ) -> tuple[str, list[Sample], dict[str, Any], dict[str, Any]]:
    sid = await new_session(http)
    base = str(http.base_url).rstrip("/")
    sdk = openai.AsyncOpenAI(base_url=f"{base}/sessions/{sid}/v1", api_key="unused",
                             max_retries=0, http_client=http)

    async def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
        r = await sdk.chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                              tools=WEATHER_TOOLS)  # type: ignore[arg-type]
        return r.choices[0].message.model_dump(exclude_none=True)

    await script(chat, agent)
    view = (await http.get(f"/sessions/{sid}")).json()
    resp = await http.post(f"/sessions/{sid}/samples", json={"metadata": AGENT_METADATA})
    assert resp.status_code == 200, resp.text
    decoded = decode_samples(resp.content)
    return sid, decoded.samples, decoded.session_metadata, view


def differences(a: Sample, b: Sample) -> list[str]:
    """The fields on which two samples differ (for the assertion message)."""
    out = [name for name in ("tokens", "loss_mask", "rollout_log_probs", "response_length",
                             "response", "status", "weight_versions", "reward")
           if repr(getattr(a, name)) != repr(getattr(b, name))]
    return out + [f"metadata.{k}" for k in sorted(set(a.metadata) | set(b.metadata))
                  if a.metadata.get(k) != b.metadata.get(k)]


def comparable(sample: Sample) -> Sample:
    """The sample without what legitimately differs: the leaf, the version, timings."""
    meta = dict(sample.metadata)
    meta.pop("leaf", None)
    meta.pop("session_version")
    meta.pop("session_id")
    meta.pop("instance_id")
    meta["lifecycle"] = [{"turn": seg["turn"]} for seg in meta["lifecycle"]]
    sample.metadata = meta
    return sample


async def run_all(gateway: Gateway, script: Any = weather_agent) -> list[Any]:
    async with asgi_client(gateway) as http:
        return list(await asyncio.gather(*(run_agent(http, a, script)
                                           for a in range(AGENTS))))


async def test_v2_equals_v1_bit_for_bit(qwen3_renderer: TemplateRenderer, qwen3_dir: Path,
                                        qwen3_self_check: dict[str, Any]) -> None:
    v1 = await run_all(make(qwen3_renderer, qwen3_dir, qwen3_self_check, "v1"))
    v2 = await run_all(make(qwen3_renderer, qwen3_dir, qwen3_self_check, "v2"))
    for agent, ((_, s1, m1, view1), (_, s2, m2, view2)) in enumerate(zip(v1, v2, strict=True)):
        assert len(s1) == 1 and len(s2) == 1, (agent, len(s1), len(s2))
        leaf = s2[0].metadata["leaf"]
        assert leaf["path_node_ids"] == WEATHER_TREE["active_path"]
        a, b = comparable(s1[0]), comparable(s2[0])
        assert samples_identical(a, b), (agent, differences(a, b))
        assert s1[0].reward is None and s2[0].reward is None
        tree = m2.pop("tree")
        assert [n["parent"] for n in tree["nodes"]] == WEATHER_TREE["parents"]
        assert [leaf["node_id"] for leaf in tree["leaves"]] == WEATHER_TREE["leaves"]
        for meta in (m1, m2):
            meta.pop("session_version"), meta.pop("session_id"), meta.pop("instance_id")
        assert m1 == m2
        assert len(view1["records"]) == len(view2["records"]) == 7
        assert view2["metadata"]["tree"]["active_leaf"] == 8


@pytest.mark.slow
async def test_first_turn_retry_parity(qwen3_renderer: TemplateRenderer, qwen3_dir: Path,
                                       qwen3_self_check: dict[str, Any]) -> None:
    """A re-sent first turn: v1 rolls back to empty, v2 grows a second root with the
    same prompt, which supersedes the first."""
    v1 = await run_all(make(qwen3_renderer, qwen3_dir, qwen3_self_check, "v1"),
                       first_turn_retry)
    v2 = await run_all(make(qwen3_renderer, qwen3_dir, qwen3_self_check, "v2"),
                       first_turn_retry)
    for (_, s1, _, _), (_, s2, m2, _) in zip(v1, v2, strict=True):
        assert [n["parent"] for n in m2["tree"]["nodes"]] == [None, None, 1]
        assert len(s2) == 1 and s2[0].metadata["leaf"]["path_node_ids"] == [1, 2]
        assert samples_identical(comparable(s1[0]), comparable(s2[0]))


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_reward_in_agent_metadata(version: str, qwen3_renderer: TemplateRenderer,
                                        qwen3_dir: Path,
                                        qwen3_self_check: dict[str, Any]) -> None:
    """v2 applies an agent reward to every kept sample; v1 leaves it in the metadata."""
    gateway = make(qwen3_renderer, qwen3_dir, qwen3_self_check, version)
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        await http.post(f"/sessions/{sid}/v1/chat/completions",
                        json={"messages": [{"role": "user", "content": "hi\nSAY yo"}]})
        resp = await http.post(f"/sessions/{sid}/samples", json={"metadata": {"reward": 0.5}})
    [sample] = decode_samples(resp.content).samples
    assert sample.metadata["reward"] == 0.5
    assert sample.reward == (0.5 if version == "v2" else None)


@pytest.mark.slow
async def test_parity_through_real_processes(qwen3_dir: Path,
                                             qwen3_stack: tuple[Any, Any]) -> None:
    """The same check from outside: `tito mock-engine`, `tito serve` v1 (the shared stack)
    and `tito serve --session-version v2`, the openai SDK over loopback HTTP."""
    from helpers.support import start_gateway

    engine, v1_gateway = qwen3_stack
    v2_gateway = start_gateway(engine.url, qwen3_dir, "qwen3", "--session-version", "v2")
    try:
        results = []
        for gateway in (v1_gateway, v2_gateway):
            async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
                results.append(await asyncio.gather(*(run_agent(http, a)
                                                      for a in range(AGENTS))))
    finally:
        v2_gateway.stop()
    for agent, ((_, s1, _, _), (_, s2, m2, _)) in enumerate(zip(*results, strict=True)):
        assert [n["parent"] for n in m2["tree"]["nodes"]] == WEATHER_TREE["parents"]
        a, b = comparable(s1[0]), comparable(s2[0])
        assert len(s2) == 1 and samples_identical(a, b), (agent, differences(a, b))
