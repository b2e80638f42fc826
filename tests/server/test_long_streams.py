"""Long streamed turns (issue 29): a 64k-token turn streamed on each door (Chat
Completions, Anthropic Messages, Responses) with the real SDKs, through real ``tito
serve`` + ``tito mock-engine`` processes in both of SGLang's stream modes (cumulative
chunks of up to megabytes, and deltas), is committed with the engine's exact ids and
logprobs and lands in the sample; and what is wrong in a stream chunk (an id outside the
vocabulary in a chunk that is not the last, an id over int32, a fault) is refused before
it is streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import numpy as np
import openai
import pytest
from helpers.inproc import new_session as new_inproc_session
from helpers.inproc import over_mock_engine
from helpers.support import (
    Proc,
    bare_sample,
    engine_log,
    new_session,
    start_gateway,
    start_mock,
    tokenizer_dir,
)

from tito.render.base import TemplateRenderer

pytestmark = pytest.mark.slow  # long streams over the real mock engine

LONG = 65536


@pytest.fixture(scope="module", params=["cumulative", "incremental"])
def long_stack(request: pytest.FixtureRequest) -> Iterator[tuple[Proc, Proc]]:
    """A mock engine (0.05 ms a token: a 64k turn streams for seconds, in many chunks) in
    the stream mode of the param, and a gateway in front of it."""
    tokenizer = tokenizer_dir("qwen3")
    mode = ["--incremental-streaming-output"] if request.param == "incremental" else []
    engine = start_mock(tokenizer, "qwen3", "--context-length", str(LONG + 4096),
                        "--token-latency-ms", "0.05", *mode)
    try:
        gateway = start_gateway(engine.url, tokenizer, "qwen3")
    except Exception:
        engine.stop()
        raise
    try:
        yield engine, gateway
    finally:
        gateway.stop()
        engine.stop()


def stream_chat(url: str, sid: str) -> tuple[str, str | None]:
    client = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x",
                           max_retries=0, timeout=300)
    text, finish = "", None
    for chunk in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"LONG {LONG}"}],
            max_tokens=LONG, stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def stream_messages(url: str, sid: str) -> tuple[str, str | None]:
    client = anthropic.Anthropic(base_url=f"{url}/sessions/{sid}", api_key="x",
                                 max_retries=0, timeout=300)
    with client.messages.stream(model="m", max_tokens=LONG, messages=[
            {"role": "user", "content": f"LONG {LONG}"}]) as events:
        text = "".join(events.text_stream)
        final = events.get_final_message()
    return text, final.stop_reason


def stream_responses(url: str, sid: str) -> tuple[str, str | None]:
    client = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x",
                           max_retries=0, timeout=300)
    text, status = "", None
    for event in client.responses.create(model="m", input=f"LONG {LONG}",
                                         max_output_tokens=LONG, stream=True):
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type in ("response.completed", "response.incomplete"):
            status = event.response.status
    return text, status


DOORS = {"chat": (stream_chat, "length"), "messages": (stream_messages, "max_tokens"),
         "responses": (stream_responses, "incomplete")}


@pytest.mark.slow
@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_64k_token_turn_streams_is_committed_and_in_the_sample(
        long_stack: tuple[Proc, Proc], door: str) -> None:
    engine, gateway = long_stack
    sid = new_session(gateway.url)
    stream, finish = DOORS[door]
    text, got = stream(gateway.url, sid)
    assert got == finish
    (entry,) = engine_log(engine.url, sid)
    assert entry["stream"] and len(entry["output_ids"]) == LONG
    assert 1 < entry["stream_chunks"] < LONG  # many chunks, coalesced as SGLang does
    view = httpx.get(f"{gateway.url}/sessions/{sid}",
                     params={"include_ids": "1", "include_messages": "1"}).json()
    (record,) = view["records"]
    assert record["output_ids"] == entry["output_ids"]
    assert record["finish_reason"] == "length"
    sample = bare_sample(gateway.url, sid)
    assert sample.tokens[-LONG:].tolist() == entry["output_ids"]
    assert sample.loss_mask is not None and int(sample.loss_mask.sum()) == LONG
    assert sample.rollout_log_probs is not None
    assert np.array_equal(sample.rollout_log_probs[-LONG:],
                          np.asarray(entry["logprobs"], dtype=np.float64))
    assert len(text) > 5 * LONG // 2 and text.strip() in sample.response


# -- what a chunk may not carry ----------------------------------------------------------
@pytest.fixture
async def slow_mock(qwen3_dir: Path, qwen3_renderer: TemplateRenderer,
                    qwen3_self_check: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app over a mock engine taking 0.5 ms a token (a stream in many chunks)."""
    async with over_mock_engine(qwen3_dir, qwen3_renderer, qwen3_self_check,
                                timeout=5, token_latency_ms=0.5) as http:
        yield http


async def streamed(http: httpx.AsyncClient, sid: str, text: str) -> tuple[int, list[Any]]:
    """(status, the data events) of a streamed chat turn."""
    body = {"messages": [{"role": "user", "content": text}], "stream": True,
            "max_tokens": 400}
    async with http.stream("POST", f"/sessions/{sid}/v1/chat/completions",
                           json=body) as resp:
        raw = (await resp.aread()).decode()
    if resp.status_code != 200:
        return resp.status_code, [httpx.Response(resp.status_code, content=raw).json()]
    events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    return 200, [e if e == "[DONE]" else httpx.Response(200, content=e).json()
                 for e in events]


STREAM_FAULTS = {
    "bad_ids:vocab": "engine_protocol_error", "bad_ids:int32": "engine_protocol_error",
    "bad_ids": "engine_protocol_error", "bad_logprob": "engine_protocol_error",
    "wrong_types": "engine_protocol_error", "malformed_json": "engine_protocol_error",
    "http_500": "engine_error", "reset": "engine_error", "reset:partial": "engine_error",
}


@pytest.mark.parametrize("fault", sorted(STREAM_FAULTS))
async def test_a_fault_in_a_stream_is_refused_before_its_text_is_streamed(
        slow_mock: httpx.AsyncClient, fault: str) -> None:
    """FAULT directives apply to streamed requests: a bad first chunk (not the last: the
    turn is 400 ids long) fails before any byte (502), a bad final chunk or a connection
    cut mid-stream ends the stream with the error event; no text of a bad chunk is sent
    and the session is unchanged, so the same turn then streams fine."""
    sid = await new_inproc_session(slow_mock)
    status, events = await streamed(slow_mock, sid, f"FAULT {fault}\nLONG 300")
    if status != 200:
        assert status == 502 and events[0]["error"]["code"] == STREAM_FAULTS[fault]
    else:  # the stream had started: it ends with the error event
        chunks = [e for e in events if isinstance(e, dict)]
        assert chunks[-1]["error"]["code"] == STREAM_FAULTS[fault]
        content = "".join((e.get("choices") or [{}])[0].get("delta", {}).get("content")
                          or "" for e in chunks[:-1])
        if fault.startswith("bad_ids") or fault == "bad_logprob":
            assert content == ""
    view = (await slow_mock.get(f"/sessions/{sid}")).json()
    assert view["records"] == []
    status, events = await streamed(slow_mock, sid, "LONG 300")
    assert status == 200 and events[-1] == "[DONE]"
    assert len((await slow_mock.get(f"/sessions/{sid}")).json()["records"]) == 1


async def test_an_id_over_int32_is_a_502_not_a_500(slow_mock: httpx.AsyncClient) -> None:
    sid = await new_inproc_session(slow_mock)
    resp = await slow_mock.post(f"/sessions/{sid}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "FAULT bad_ids int32\nSAY hi"}]})
    assert resp.status_code == 502
    error = resp.json()["error"]
    assert error["code"] == "engine_protocol_error" and "2147483648" in error["message"]
