"""Real token streaming (real ``tito serve`` + ``tito mock-engine`` processes, the real
``openai`` and ``anthropic`` SDKs): streamed turns give the records and samples of the
same conversation sent without streaming, the turn is committed before the terminal
event, and a client that leaves mid-stream leaves the session as it was."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from helpers.inproc import asgi_client
from helpers.scripted import WEATHER_TOOLS, weather_agent
from helpers.scripted_claude import run_claude
from helpers.support import (
    Proc,
    bare_sample,
    new_session,
    start_gateway,
    start_mock,
    tokenizer_dir,
)

from tito.samples.sample import samples_identical
from tito.types.engine import StreamChunk
from tito.types.errors import EngineUnreachable


def streamed_message(chunks: Iterator[Any]) -> dict[str, Any]:
    """The assistant message a client puts together from a chat stream."""
    content, reasoning = "", ""
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                  "function": {"name": call.function.name,
                                                               "arguments": ""}})
            entry["function"]["arguments"] += call.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


async def run_weather(url: str, sid: str, *, stream: bool) -> list[dict[str, Any]]:
    client = openai.AsyncOpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x",
                                max_retries=0)
    replies: list[dict[str, Any]] = []

    async def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if stream:
            events = await client.chat.completions.create(
                model="m", messages=messages, tools=WEATHER_TOOLS, stream=True)  # type: ignore[arg-type]
            message = streamed_message(iter([c async for c in events]))
        else:
            reply = await client.chat.completions.create(
                model="m", messages=messages, tools=WEATHER_TOOLS)  # type: ignore[arg-type]
            message = reply.choices[0].message.model_dump(exclude_none=True)
        replies.append(message)
        return message

    async with client:
        await weather_agent(chat, 3)
    return replies


async def test_chat_streamed_conversation_equals_the_unstreamed_one(stack: Any) -> None:
    engine, gateway = stack
    streamed_sid, plain_sid = new_session(gateway.url), new_session(gateway.url)
    streamed = await run_weather(gateway.url, streamed_sid, stream=True)
    log = httpx.get(engine.url + "/mock/requests").json()
    assert len(log) == 9 and all(entry["stream"] for entry in log)
    for prev, cur in itertools.pairwise(log):
        if cur["input_ids"] != prev["input_ids"]:  # (a retry sends its prompt again)
            stored = prev["input_ids"] + prev["output_ids"]
            assert cur["input_ids"][: len(stored)] == stored, "TITO invariant broken"
    plain = await run_weather(gateway.url, plain_sid, stream=False)
    for a, b in zip(streamed, plain, strict=True):  # same text, same calls (ids differ)
        assert (a["content"] or "") == (b.get("content") or "")
        assert (a.get("reasoning_content") or "") == (b.get("reasoning_content") or "")
        assert [c["function"] for c in a.get("tool_calls", [])] == \
            [c["function"] for c in b.get("tool_calls", [])]
    assert samples_identical(bare_sample(gateway.url, streamed_sid),
                             bare_sample(gateway.url, plain_sid))


def test_the_turn_is_committed_before_the_terminal_event(stack: Any) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    client = openai.OpenAI(base_url=f"{gateway.url}/sessions/{sid}/v1", api_key="x",
                           max_retries=0)
    first = [{"role": "user", "content": "SAY Hello there."}]
    stream = client.chat.completions.create(model="m", messages=first, stream=True)  # type: ignore[arg-type]
    text = ""
    for chunk in stream:
        text += chunk.choices[0].delta.content or ""
        if chunk.choices[0].finish_reason is not None:
            break  # the next turn at once, the stream not read to its end
    reply = client.chat.completions.create(model="m", messages=[  # type: ignore[arg-type]
        *first, {"role": "assistant", "content": text},
        {"role": "user", "content": "SAY Again."}])
    assert reply.choices[0].message.content == "Again."
    stream.close()
    meta = httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]
    assert meta["num_turns"] == 2


def test_anthropic_streamed_conversation_equals_the_unstreamed_one(stack: Any) -> None:
    _, gateway = stack
    streamed_sid, plain_sid = new_session(gateway.url), new_session(gateway.url)
    streamed = run_claude(gateway.url, streamed_sid, stream=True)
    plain = run_claude(gateway.url, plain_sid)
    for a, b in zip(streamed, plain, strict=True):
        assert a.stop_reason == b.stop_reason and a.usage.output_tokens == b.usage.output_tokens
        assert [blk.type for blk in a.content] == [blk.type for blk in b.content]
        for x, y in zip(a.content, b.content, strict=True):
            if x.type == "tool_use":
                assert (x.name, x.input) == (y.name, y.input)  # type: ignore[union-attr]
            else:
                assert x.model_dump(exclude={"citations", "parsed_output"}) == \
                    y.model_dump(exclude={"citations", "parsed_output"})
    assert samples_identical(bare_sample(gateway.url, streamed_sid),
                             bare_sample(gateway.url, plain_sid))


@pytest.fixture(scope="module")
def slow_stack() -> Iterator[tuple[Proc, Proc]]:
    """A mock engine that takes 20 ms per token, and a gateway in front of it that asks
    for stream chunks of 2 ids."""
    tokenizer = tokenizer_dir("qwen3")
    engine = start_mock(tokenizer, "qwen3", "--token-latency-ms", "20")
    try:
        gateway = start_gateway(engine.url, tokenizer, "qwen3", "--stream-interval", "2")
    except Exception:
        engine.stop()
        raise
    try:
        yield engine, gateway
    finally:
        gateway.stop()
        engine.stop()


@pytest.mark.slow
@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_a_client_that_leaves_mid_stream_leaves_the_session_as_it_was(
        slow_stack: tuple[Proc, Proc], api: str) -> None:
    engine, gateway = slow_stack
    sid = new_session(gateway.url)
    if api == "chat":
        path, body = "v1/chat/completions", {"messages": [
            {"role": "user", "content": "SAY " + "word " * 100}], "stream": True}
    elif api == "messages":
        path, body = "v1/messages", {"model": "m", "max_tokens": 200, "stream": True,
                                     "messages": [{"role": "user",
                                                   "content": "SAY " + "word " * 100}]}
    else:
        path, body = "v1/responses", {"input": "SAY " + "word " * 100, "stream": True,
                                      "max_output_tokens": 200}
    with httpx.stream("POST", f"{gateway.url}/sessions/{sid}/{path}", json=body) as resp:
        assert resp.status_code == 200
        received = []
        for line in resp.iter_lines():  # until some text arrived, then hang up
            received.append(line)
            if "word" in line:
                break
    assert "word" in received[-1] and len(received) < 40
    for _ in range(200):
        metrics = httpx.get(gateway.url + "/metrics").text
        if "tito_engine_aborts_total" in metrics:
            break
        time.sleep(0.02)
    meta = httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]
    assert meta["num_turns"] == 0 and not meta["turn_in_progress"]
    assert "tito_engine_aborts_total" in metrics
    aborted = httpx.get(engine.url + "/mock/requests").json()[-1]
    assert len(aborted["output_ids"]) < 100  # the engine stopped generating


@pytest.mark.slow
def test_a_tool_call_is_sent_as_soon_as_it_is_complete(
        slow_stack: tuple[Proc, Proc]) -> None:
    engine, gateway = slow_stack
    sid = new_session(gateway.url)
    body = {"messages": [{"role": "user", "content":
                          'CALL get_weather {"city": "Paris"}\n'
                          'CALL get_weather {"city": "a town with a rather long name, '
                          'so that this call takes a while to generate"}'}],
            "tools": WEATHER_TOOLS, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/sessions/{sid}/v1/chat/completions",
                      json=body) as resp:
        seen_running = None
        ids = []
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    ids.append(call["id"])
                    if call["index"] == 0:  # the first call, while the second generates
                        meta = httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]
                        seen_running = meta["turn_in_progress"]
    assert seen_running is True and len(ids) == 2
    view = httpx.get(f"{gateway.url}/sessions/{sid}", params={"include_messages": "true"})
    stored = view.json()["messages"][-1]["tool_calls"]
    assert [c["id"] for c in stored] == ids  # the ids the client saw are the stored ones
    sent = httpx.get(engine.url + "/mock/requests").json()[-1]
    assert sent["stream"] and sent["sampling_params"]["stream_interval"] == 2


@pytest.mark.parametrize("path", ["v1/chat/completions", "v1/messages", "v1/responses"])
async def test_an_engine_failure_mid_stream_is_an_error_event_logged_with_its_cause(
        make_gateway: Any, caplog: pytest.LogCaptureFixture, path: str) -> None:
    gateway = make_gateway()

    async def broken_stream(*args: Any, **kwargs: Any) -> Any:
        yield StreamChunk([9707])  # one id, then the engine goes away
        raise EngineUnreachable("engine transport error: connection reset")

    gateway.engine.generate_stream = broken_stream
    body: dict[str, Any] = {"stream": True, "max_tokens": 16}
    if path == "v1/responses":
        body["input"] = "SAY hi"
    else:
        body["messages"] = [{"role": "user", "content": "SAY hi"}]
    async with asgi_client(gateway) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        resp = await http.post(f"/sessions/{sid}/{path}", json=body)
        assert resp.status_code == 200  # the stream had started
        assert "connection reset" in resp.text and "engine_error" in resp.text
        view = (await http.get(f"/sessions/{sid}")).json()
        assert view["metadata"]["num_turns"] == 0 and not view["metadata"]["turn_in_progress"]
        metrics = (await http.get("/metrics")).text
    route = "/sessions/{session_id}/" + path
    assert f'tito_errors_total{{status="502",code="engine_error",route="{route}"}} 1' in metrics
    assert any("-> 502 engine_error" in r.getMessage() for r in caplog.records)
