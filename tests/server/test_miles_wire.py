"""The reference framework's wire additions through real HTTP: ``tito serve`` over
``tito mock-engine`` (real processes) whose meta_info reports weight-version spans (a
weight update mid-generation) and speculative-decoding counters as SGLang does.

Per-call ``weight_versions`` spans, ``spec_info``, the tree's ``seq`` and the v2 leaf,
and ``tito.integrations.miles`` carrying them into both framework sample types.
"""

from __future__ import annotations

import asyncio
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import miles_standins as fw
from helpers import miles_standins_next as fw_next
from helpers.support import Proc, start_gateway, start_mock

from tito.engines.mock.replies import spec_counters
from tito.integrations import miles
from tito.samples import decode_samples

pytestmark = pytest.mark.slow

DRAFTS = 4
LONG = {"role": "user", "content": "tell me\nSAY " + " ".join(["word"] * 40)}


@pytest.fixture(scope="module")
def stack(qwen3_dir: Path) -> Iterator[tuple[Proc, Proc, Proc]]:
    """A slow mock with speculative counters; a v1 and a v2 gateway in front of it."""
    engine = start_mock(qwen3_dir, "qwen3", "--token-latency-ms", "20",
                        "--speculative-num-draft-tokens", str(DRAFTS))
    started: list[Proc] = [engine]
    try:
        started.append(start_gateway(engine.url, qwen3_dir, "qwen3"))
        started.append(start_gateway(engine.url, qwen3_dir, "qwen3",
                                     "--session-version", "v2"))
        yield engine, started[1], started[2]
    finally:
        for proc in reversed(started):
            proc.stop()


async def weight_update_mid_turn(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """One turn whose generation the weights change under (v0 -> v1), through the
    gateway's pause / update / continue; its chat reply (with ``meta_info``)."""
    await http.post("/update_weight_version", json={"new_version": "v0"})
    task = asyncio.create_task(http.post(
        f"/sessions/{sid}/v1/chat/completions",
        json={"messages": [LONG], "return_meta_info": True}))
    await asyncio.sleep(0.3)  # some ids generated under v0
    assert (await http.post("/pause", json={"mode": "retract"})).status_code == 200
    assert (await http.post("/update_weight_version",
                            json={"new_version": "v1"})).status_code == 200
    assert (await http.post("/continue")).status_code == 200
    reply = await asyncio.wait_for(task, 30)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


async def second_turn(http: httpx.AsyncClient, sid: str, first: dict[str, Any]
                      ) -> dict[str, Any]:
    message = first["choices"][0]["message"]
    reply = await http.post(f"/sessions/{sid}/v1/chat/completions", json={
        "messages": [LONG, {"role": "assistant", "content": message["content"]},
                     {"role": "user", "content": "again\nSAY fine thanks"}],
        "return_meta_info": True})
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


async def test_per_call_spans_and_spec_counters(stack: tuple[Proc, Proc, Proc]) -> None:
    _, gateway, _ = stack
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        first = await weight_update_mid_turn(http, sid)
        second = await second_turn(http, sid, first)
        metas = [r["choices"][0]["meta_info"] for r in (first, second)]
        record = (await http.get(f"/sessions/{sid}", params={"include_requests": 1})).json()
        default = decode_samples((await http.post(f"/sessions/{sid}/samples")).content)
        spans = decode_samples((await http.post(
            f"/sessions/{sid}/samples", json={"weight_versions_format": "spans"})).content)
        bad = await http.post(f"/sessions/{sid}/samples",
                              json={"weight_versions_format": "strings"})

    # the engine's facts reach the agent and the records as the engine sent them
    assert [s["version"] for s in metas[0]["weight_versions"]] == ["v0", "v1"]
    assert "weight_versions" not in metas[1]  # unchanged weights: no spans (SGLang)
    for meta in metas:
        assert {k: meta[k] for k in meta if k.startswith("spec_")} == \
            spec_counters(meta["completion_tokens"], DRAFTS)
    assert [r["response"]["choices"][0]["meta_info"]["spec_verify_ct"]
            for r in record["records"]] == [m["spec_verify_ct"] for m in metas]

    [plain], [per_call] = default.samples, spans.samples
    assert plain.weight_versions == per_call.weight_versions == ["v1", "v1"]
    assert plain.weight_version_calls == []
    first_call, second_call = per_call.weight_version_calls
    assert [s["version"] for s in first_call] == ["v0", "v1"]
    assert first_call[0]["abs_start"] == per_call.prompt_length
    assert first_call[0]["abs_end"] == first_call[1]["abs_start"]
    generated = [int(m["completion_tokens"]) for m in metas]
    assert first_call[1]["abs_end"] == per_call.prompt_length + generated[0]
    [only] = second_call
    assert only["version"] == "v1" and only["abs_end"] == len(per_call.tokens)
    assert only["abs_end"] - only["abs_start"] == generated[1]
    # the merged spans in the metadata agree with the calls
    assert [(s["version"], s["start"], s["end"])
            for s in per_call.metadata["weight_version_spans"]] == [
        ("v0", first_call[0]["abs_start"], first_call[0]["abs_end"]),
        ("v1", first_call[1]["abs_start"], only["abs_end"])]

    totals = [spec_counters(n, DRAFTS) for n in generated]
    expected = {"spec_num_correct_drafts": sum(t["spec_num_correct_drafts"] for t in totals),
                "spec_num_proposed_drafts": sum(t["spec_num_proposed_drafts"] for t in totals),
                "spec_verify_ct": sum(t["spec_verify_ct"] for t in totals),
                "completion_tokens": sum(generated)}
    assert plain.spec_info == per_call.spec_info == expected
    assert [t["spec_verify_ct"] for t in plain.metadata["spec_info_turns"]] == \
        [t["spec_verify_ct"] for t in totals]
    assert bad.status_code == 400 and "weight_versions_format" in bad.text


async def test_a_snapshot_export_must_repeat_its_format(stack: tuple[Proc, Proc, Proc]
                                                         ) -> None:
    _, gateway, _ = stack
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        await http.post("/update_weight_version", json={"new_version": "v1"})
        sid = (await http.post("/sessions")).json()["session_id"]
        reply = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                json={"messages": [{"role": "user", "content": "SAY hi"}]})
        assert reply.status_code == 200
        snap = (await http.post(f"/sessions/{sid}/finish", json={})).json()["snapshot_id"]
        body = {"snapshot_id": snap, "weight_versions_format": "spans"}
        first = await http.post(f"/sessions/{sid}/samples", json=body)
        again = await http.post(f"/sessions/{sid}/samples", json=body)
        other = await http.post(f"/sessions/{sid}/samples", json={"snapshot_id": snap})
    assert first.status_code == again.status_code == 200
    assert first.content == again.content
    assert other.status_code == 409
    [sample] = decode_samples(first.content).samples
    assert [[s["version"] for s in call] for call in sample.weight_version_calls] == [["v1"]]


async def test_v2_tree_and_leaf_carry_the_reference_keys(stack: tuple[Proc, Proc, Proc]
                                                          ) -> None:
    _, _, gateway = stack
    user = {"role": "user", "content": "SAY hello there"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        for _ in range(2):  # a retry of the first turn: two roots
            reply = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                    json={"messages": [user]})
            assert reply.status_code == 200
        view = (await http.get(f"/sessions/{sid}")).json()
        decoded = decode_samples((await http.post(
            f"/sessions/{sid}/samples", json={"metadata": {"reward": 0.5}})).content)
    reference_node = {"id", "parent", "seq", "truncated", "committed_at", "completion_span",
                      "num_tokens", "response_id"}
    for tree in (view["metadata"]["tree"], decoded.session_metadata["tree"]):
        assert all(reference_node <= set(node) for node in tree["nodes"])
        assert [n["seq"] for n in tree["nodes"]] == [n["id"] for n in tree["nodes"]] == [0, 1]
        assert all(set(leaf) == {"node_id", "path_node_ids"} for leaf in tree["leaves"])
    [sample] = decoded.samples  # the re-sent first turn supersedes the first root
    assert {"node_id", "parent", "path_node_ids", "response_id"} <= set(sample.metadata["leaf"])
    assert sample.metadata["leaf"]["node_id"] == 1 and sample.reward == 0.5
    assert sample.spec_info is not None and sample.spec_info["spec_verify_ct"] > 0


@pytest.mark.parametrize("standins", [fw, fw_next], ids=["31f1ca96", "per-call"])
async def test_the_integration_carries_them_into_the_framework_sample(
        stack: tuple[Proc, Proc, Proc], standins: Any) -> None:
    _, gateway, _ = stack
    httpx.post(gateway.url + "/update_weight_version", json={"new_version": "v7"})
    args = Namespace(tito_url=gateway.url, max_seq_len=4096, tito_lifecycle="finish",
                     custom_agent_function_path="helpers.miles_standins.weather")
    sample = standins.Sample(prompt=[{"role": "user", "content": "Hello?\nSAY Hi."}],
                             metadata={"id": "q1"}, index=1)
    out = await miles.generate(fw.GenerateFnInput(
        fw.GenerateState(args), sample, {"max_new_tokens": 48, "temperature": 0.0}, False))
    got = out.samples
    turns = got.metadata["num_turns"]
    if standins is fw:  # the merged wire: a version string per turn, older counter names
        assert got.weight_versions == ["v7"] * turns
        info = got.spec_info
        assert isinstance(info, fw.Sample.SpecInfo)
        assert info.completion_token_num == got.response_length - _bridge(got)
        assert info.spec_accept_token_num == info.completion_token_num - info.spec_verify_ct
        return
    calls = got.weight_versions
    assert len(calls) == turns
    assert all(isinstance(c, fw_next.WeightVersionsPerCall) for c in calls)
    assert all(span.version == "v7" for c in calls for span in c.spans)
    trained = [i for i, m in enumerate(got.loss_mask) if m]
    start = len(got.tokens) - got.response_length
    assert sorted(i for c in calls for span in c.spans
                  for i in range(span.abs_start - start, span.abs_end - start)) == trained
    info = got.spec_info
    assert isinstance(info, fw_next.Sample.SpecInfo)
    assert info.completion_tokens == len(trained)
    assert info.spec_num_correct_drafts == info.completion_tokens - info.spec_verify_ct


def _bridge(sample: Any) -> int:
    return sum(1 for m in sample.loss_mask if not m)
