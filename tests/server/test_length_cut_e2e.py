"""Turns after a length cut end to end (design §5.6): ``tito serve`` processes over
``tito mock-engine``, the real openai SDK, v1 and v2.

``--after-length-cut keep`` (the default): a cut turn followed by more turns (one of them
streamed, one cut again): every committed turn is in the sample, the cut replies train
with the engine's logprobs, the closing token the template put after each is bridge,
``length_cut_turns`` lists them, the status is the last turn's. ``refuse``: extending a cut
reply is 409 ``truncated_generation`` before the engine sees anything, and the session is
exactly as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers.support import Proc, assert_tito_chain, engine_log, new_session, start_gateway

from tito.render import build_renderer
from tito.samples import decode_samples

pytestmark = pytest.mark.slow  # starts three gateway processes

CONFIGS = [("v1", "refuse"), ("v2", "keep"), ("v2", "refuse")]
"""Gateways this module starts (``v1 keep`` is the shared stack's)."""


@pytest.fixture(scope="module")
def gateways(qwen3_stack: tuple[Proc, Proc], qwen3_dir: Path
             ) -> Iterator[dict[tuple[str, str], Proc]]:
    engine, default = qwen3_stack

    def start(config: tuple[str, str]) -> Proc:
        version, policy = config
        return start_gateway(engine.url, qwen3_dir, "qwen3", "--session-version", version,
                             "--after-length-cut", policy)

    with ThreadPoolExecutor(len(CONFIGS)) as pool:
        futures = [pool.submit(start, config) for config in CONFIGS]
        started = [f.result() for f in futures]
    try:
        yield {("v1", "keep"): default, **dict(zip(CONFIGS, started, strict=True))}
    finally:
        for proc in started:
            proc.stop()


def sdk(url: str, sid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="unused",
                         max_retries=0)


def chat(client: openai.OpenAI, messages: list[dict[str, Any]], *, stream: bool = False,
         max_tokens: int | None = None) -> tuple[dict[str, Any], str]:
    """One turn: (the assistant message to send back, the finish reason)."""
    if not stream:
        r = client.chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                           max_tokens=max_tokens)
        return r.choices[0].message.model_dump(exclude_none=True), str(r.choices[0].finish_reason)
    text, finish = "", ""
    for chunk in client.chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                                max_tokens=max_tokens, stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return {"role": "assistant", "content": text}, finish


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_keep_puts_every_turn_after_a_cut_in_the_sample(
        gateways: dict[tuple[str, str], Proc], qwen3_stack: tuple[Proc, Proc],
        qwen3_dir: Path, version: str) -> None:
    engine = qwen3_stack[0]
    url = gateways[(version, "keep")].url
    sid = new_session(url)
    client = sdk(url, sid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "LONG 50"}]
    finishes = []
    for k, (stream, max_tokens, next_user) in enumerate([
            (False, 8, "SAY after the cut"), (True, None, "LONG 40"),
            (True, 5, "SAY done"), (False, None, None)]):
        reply, finish = chat(client, messages, stream=stream, max_tokens=max_tokens)
        finishes.append(finish)
        messages.append(reply)
        if next_user is not None:
            messages.append({"role": "user", "content": next_user})
        assert len(engine_log(engine.url, sid)) == k + 1
    assert finishes == ["length", "stop", "length", "stop"]
    log = engine_log(engine.url, sid)
    assert_tito_chain(log)
    resp = httpx.post(f"{url}/sessions/{sid}/samples", json={})
    assert resp.status_code == 200, resp.text
    [sample] = decode_samples(resp.content).samples
    assert sample.status == "completed"  # the last turn's
    assert sample.tokens.tolist() == log[-1]["input_ids"] + log[-1]["output_ids"]
    assert len(sample.metadata["lifecycle"]) == 4  # every committed turn
    prompt = sample.prompt_length
    assert prompt == len(log[0]["input_ids"])
    mask = [0] * sample.response_length
    logprobs = [0.0] * sample.response_length
    spans = []
    for entry in log:
        start = len(entry["input_ids"])
        spans.append((start, start + len(entry["output_ids"])))
        for i, lp in enumerate(entry["logprobs"]):
            mask[start - prompt + i], logprobs[start - prompt + i] = 1, lp
    assert sample.loss_mask.tolist() == mask
    assert sample.rollout_log_probs.tolist() == pytest.approx(logprobs, abs=0, rel=1e-6)
    assert sample.metadata["length_cut_turns"] == [
        {"turn": k, "start": spans[k][0], "end": spans[k][1]} for k in (0, 2)]
    close = build_renderer("qwen3", qwen3_dir).tokenizer.encode("<|im_end|>")
    for k in (0, 2):  # the closing token after each cut reply: bridge, never trained
        end = spans[k][1]
        assert sample.tokens[end : end + len(close)].tolist() == close
        assert mask[end - prompt] == 0 and sample.rollout_log_probs[end - prompt] == 0.0


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_refuse_is_409_before_the_engine_and_changes_nothing(
        gateways: dict[tuple[str, str], Proc], qwen3_stack: tuple[Proc, Proc],
        version: str) -> None:
    engine = qwen3_stack[0]
    url = gateways[(version, "refuse")].url
    sid = new_session(url)
    client = sdk(url, sid)
    first = [{"role": "user", "content": "SAY hello"}]
    reply, _ = chat(client, first)
    messages = [*first, reply, {"role": "user", "content": "LONG 50"}]
    cut, finish = chat(client, messages, max_tokens=6)
    assert finish == "length"
    view = httpx.get(f"{url}/sessions/{sid}", params={"include_ids": "1"}).json()
    for stream in (False, True):
        with pytest.raises(openai.ConflictError) as err:
            chat(client, [*messages, cut, {"role": "user", "content": "SAY more"}],
                 stream=stream)
        body = err.value.body
        assert isinstance(body, dict) and body.get("code") == "truncated_generation", body
        assert "--after-length-cut refuse" in str(body.get("message"))
    assert len(engine_log(engine.url, sid)) == 2  # no engine request for the refused turns
    assert httpx.get(f"{url}/sessions/{sid}", params={"include_ids": "1"}).json() == view
    retry, _ = chat(client, [*messages[:-1], {"role": "user", "content": "SAY shorter"}])
    assert retry["content"] == "shorter"  # a retry of the cut turn is served
    resp = httpx.post(f"{url}/sessions/{sid}/samples", json={})
    samples = decode_samples(resp.content).samples
    assert any(len(s.metadata["lifecycle"]) == 2 and s.status == "completed"
               for s in samples)


@pytest.mark.parametrize("policy", ["keep", "refuse"])
async def test_demo_agent_under_either_rule(gateways: dict[tuple[str, str], Proc],
                                            policy: str) -> None:
    """The demo agent: under ``keep`` it goes on after a cut reply and the sample holds
    every turn; under ``refuse`` its episode ends at the cut (told by the 409)."""
    from tito.client.agent import generate
    from tito.client.tracer import SessionTracer
    from tito.examples import calculator_agent as demo

    prompt = [{"role": "user", "content": "What is 2 + 2?\nSAY 4\nLONG 3"}]
    async with SessionTracer(gateways[("v1", policy)].url) as tracer:
        [sample] = await generate(demo.run_agent, prompt, {"max_new_tokens": 64},
                                  tracer=tracer, metadata={"answer": 4}, max_turns=3)
    meta = sample.metadata
    if policy == "keep":
        assert meta["turns"] == len(meta["lifecycle"]) == 3 and meta["stopped"] == "max_turns"
        assert [c["turn"] for c in meta["length_cut_turns"]] == [0]
    else:
        assert meta["stopped"] == "truncated_generation"
        assert meta["turns"] == len(meta["lifecycle"]) == 1 and sample.status == "truncated"
