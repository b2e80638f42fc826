"""The Anthropic Messages API on a session (real ``tito serve`` + ``tito mock-engine``
processes, the real ``anthropic`` SDK): tools, tool results with errors, thinking history,
stop reasons, count_tokens, errors in Anthropic's envelope, and the sample equal to the
same conversation sent through Chat Completions."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest
from helpers.scripted import WEATHER_TOOLS
from helpers.scripted_claude import USER_TURNS, blocks, claude, run_claude
from helpers.support import assert_tito_chain, bare_sample, engine_log, new_session

from tito.samples.sample import samples_identical


def run_chat(url: str, sid: str) -> None:
    """The same conversation through Chat Completions."""
    client = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a weather bot.\nBe brief."}]
    last: Any = None
    for turn in USER_TURNS:
        if isinstance(turn, str) and turn.startswith(("tool:", "error:")):
            kind, _, text = turn.partition(":")
            messages.append({"role": "tool", "tool_call_id": last.tool_calls[0].id,
                             "content": text if kind == "tool" else "Error: " + text})
        elif isinstance(turn, list):
            messages.append({"role": "user", "content": "\n".join(b["text"] for b in turn)})
        else:
            messages.append({"role": "user", "content": turn})
        reply = client.chat.completions.create(model="m", max_tokens=64, tools=WEATHER_TOOLS,  # type: ignore[arg-type]
                                               messages=messages)  # type: ignore[arg-type]
        last = reply.choices[0].message
        messages.append(last.model_dump(exclude_none=True))


def test_tool_conversation_keeps_tito_and_equals_chat(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    replies = run_claude(gateway.url, sid)
    log = engine_log(engine.url)
    assert len(log) == 4
    assert_tito_chain(log)

    first = replies[0]
    assert first.stop_reason == "tool_use" and first.role == "assistant"
    kinds = [b.type for b in first.content]
    assert kinds[0] == "thinking" and kinds[-1] == "tool_use"
    assert first.content[0].thinking.strip() == "The user wants the weather."  # type: ignore[union-attr]
    call = first.content[-1]
    assert call.name == "get_weather" and call.input == {"city": "Paris"}  # type: ignore[union-attr]
    assert replies[1].stop_reason == "end_turn"
    assert replies[1].content[-1].text.endswith("It is sunny in Paris.")  # type: ignore[union-attr]
    assert replies[3].content[-1].text.endswith("Sorry, London did not answer.")  # type: ignore[union-attr]
    usage = replies[1].usage
    assert usage.input_tokens + usage.cache_read_input_tokens == len(log[1]["input_ids"])
    assert usage.output_tokens == len(log[1]["output_ids"])

    # the error result reached the model as "Error: ..." in a tool message
    view = httpx.get(f"{gateway.url}/sessions/{sid}",
                     params={"include_messages": "true", "limit": 10}).json()
    tool_messages = [m for m in view["messages"] if m["role"] == "tool"]
    assert tool_messages[-1]["content"] == "Error: timeout\nSAY Sorry, London did not answer."
    assert view["metadata"]["num_turns"] == 4  # no rollback: every resend matched

    chat_sid = new_session(gateway.url)
    httpx.delete(engine.url + "/mock/requests")
    run_chat(gateway.url, chat_sid)
    assert samples_identical(bare_sample(gateway.url, sid), bare_sample(gateway.url, chat_sid))


def test_stop_sequence_and_max_tokens(stack: Any) -> None:
    _, gateway = stack
    client = claude(gateway.url, new_session(gateway.url))
    reply = client.messages.create(model="m", max_tokens=64, stop_sequences=["sunny"],
                                   messages=[{"role": "user", "content": "SAY It is sunny."}])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "sunny"
    client = claude(gateway.url, new_session(gateway.url))
    reply = client.messages.create(model="m", max_tokens=3,
                                   messages=[{"role": "user", "content": "SAY one two three "
                                              "four five six seven"}])
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 3


def test_thinking_switch_and_count_tokens(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    client = claude(gateway.url, sid)
    messages = [{"role": "user", "content": "SAY Hello."}]
    counted = client.messages.count_tokens(model="m", messages=messages,  # type: ignore[arg-type]
                                           thinking={"type": "disabled"})
    reply = client.messages.create(model="m", max_tokens=32, messages=messages,  # type: ignore[arg-type]
                                   thinking={"type": "disabled"})
    (entry,) = engine_log(engine.url)
    assert counted.input_tokens == len(entry["input_ids"])
    # qwen3's switch: thinking disabled puts the empty think block in the prompt
    assert reply.content[-1].text.strip() == "Hello."  # type: ignore[union-attr]
    with_thinking = claude(gateway.url, new_session(gateway.url)).messages.count_tokens(
        model="m", messages=messages)  # type: ignore[arg-type]
    assert with_thinking.input_tokens < counted.input_tokens
    assert httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]["num_turns"] == 1


@pytest.mark.parametrize(("body", "expected"), [
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AA=="}}]}]}, "messages.0.content.0 is an image"),
    ({"tools": [{"input_schema": {"type": "object"}}]}, "tools.0.name"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "'robot' is not a role"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f",
                                                  "input": {}}]}]},
     "a 'tool_use' block belongs to an assistant message"),
])
def test_bad_requests_are_400_in_anthropic_shape(stack: Any, body: dict[str, Any],
                                                 expected: str) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    request = {"model": "m", "max_tokens": 16,
               "messages": [{"role": "user", "content": "SAY Hi."}], **body}
    resp = httpx.post(f"{gateway.url}/sessions/{sid}/v1/messages", json=request)
    assert resp.status_code == 400, resp.text
    error = resp.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert expected in error["error"]["message"]
    assert httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]["num_turns"] == 0
    with pytest.raises(anthropic.BadRequestError) as caught:  # the SDK reads it as such
        claude(gateway.url, sid).messages.create(**request)
    assert expected in caught.value.body["error"]["message"]  # type: ignore[index]


def test_errors_of_the_session_and_the_door_use_anthropic_shape(stack: Any) -> None:
    _, gateway = stack
    client = claude(gateway.url, "0" * 32)
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="m", max_tokens=8,
                               messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    resp = httpx.post(f"{gateway.url}/sessions/{'0' * 32}/v1/messages", content=b"x",
                      headers={"content-type": "text/plain"})
    assert resp.status_code == 415 and resp.json()["type"] == "error"


def test_system_and_developer_roles_inside_messages_are_system_messages(stack: Any) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    client = claude(gateway.url, sid)
    first = client.messages.create(model="m", max_tokens=32,
                                   messages=[{"role": "user", "content": "SAY One."}])
    client.messages.create(model="m", max_tokens=32, messages=[  # type: ignore[misc]
        {"role": "user", "content": "SAY One."},
        {"role": "assistant", "content": blocks(first)},
        {"role": "system", "content": "Reminder: be brief."},  # type: ignore[misc]
        {"role": "user", "content": "SAY Two."}])
    view = httpx.get(f"{gateway.url}/sessions/{sid}",
                     params={"include_messages": "true"}).json()
    assert [m["role"] for m in view["messages"]] == ["user", "assistant", "system", "user",
                                                     "assistant"]
