"""The OpenAI Responses API on a session (real ``tito serve`` + ``tito mock-engine``
processes, the real ``openai`` SDK): text turns, function calls sent back as full input
history or continued with ``previous_response_id`` (same engine prompts, TITO invariant on
every turn), the sample equal to the same conversation sent through Chat Completions,
errors in OpenAI's envelope that leave the session as it was, ``max_output_tokens`` and
the reasoning switch; and (in-process) a v2 session continuing a response after a journal
replay."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers.fakes import FakeEngine
from helpers.inproc import asgi_client, openai_for
from helpers.inproc import new_session as new_inproc_session
from helpers.scripted import WEATHER_TOOLS
from helpers.support import assert_tito_chain, engine_log, new_session
from openai.types.responses import Response

from tito.samples import decode_samples
from tito.samples.sample import Sample, samples_identical
from tito.server.gateway import Gateway

TOOLS = [{"type": "function", "name": t["function"]["name"],
          "description": t["function"]["description"],
          "parameters": t["function"]["parameters"], "strict": False}
         for t in WEATHER_TOOLS]
INSTRUCTIONS = "You are a weather bot."
FIRST = 'THINK I need the weather\nCALL get_weather {"city": "Paris"}'
PARIS = "sunny, 21 C\nSAY It is sunny in Paris."
FOLLOW_UP = 'And London and Tokyo?\nCALL get_weather {"city": "London"}\n' \
            'CALL get_weather {"city": "Tokyo"}'
RESULTS = ["rain, 12 C", "clear, 18 C\nSAY Rainy in London, clear in Tokyo."]
REMINDER = "Reminder: be brief."
LAST = "Thanks!\nSAY Bye."




def client_for(url: str, sid: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x",
                              max_retries=0)






def view(url: str, sid: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/sessions/{sid}",
                          params={"include_messages": "true"}).json())


def sample_of(url: str, sid: str) -> Sample:
    """The session's one sample, less what differs between sessions of one gateway."""
    resp = httpx.post(f"{url}/sessions/{sid}/samples", json={})
    assert resp.status_code == 200, resp.text
    (sample,) = decode_samples(resp.content).samples
    # the id, the timings, and the engine's prefix cache (warmer for the second session)
    metadata = {k: v for k, v in sample.metadata.items()
                if k not in ("session_id", "lifecycle")}
    return dataclasses.replace(sample, metadata=metadata, prefix_cache_info=None)


def calls_of(response: Response) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


async def weather_turns(client: openai.AsyncOpenAI, *, chained: bool,
                        stream: bool = False) -> list[Response]:
    """Four turns: a call (with reasoning), its result, a developer reminder and a
    follow-up with two parallel calls, their results, then a last user message.
    ``chained``: each turn sends only its new items with ``previous_response_id``;
    else the whole history, the earlier output items echoed back as the SDK gives them.
    ``stream``: each turn streamed (``client.responses.stream``, its final response)."""
    history: list[Any] = []
    replies: list[Response] = []

    async def turn(new: list[Any]) -> Response:
        history.extend(new)
        if chained and replies:
            kwargs: Any = {"input": new, "previous_response_id": replies[-1].id}
        else:
            kwargs = {"input": history, "instructions": INSTRUCTIONS}
        if stream:
            async with client.responses.stream(model="m", tools=TOOLS, **kwargs) as events:
                reply: Response = await events.get_final_response()
        else:
            reply = await client.responses.create(model="m", tools=TOOLS, **kwargs)
        history.extend(reply.output)
        replies.append(reply)
        return reply

    first = await turn([{"role": "user", "content": FIRST}])
    (call,) = calls_of(first)
    second = await turn([{"type": "function_call_output", "call_id": call.call_id,
                          "output": PARIS}])
    assert second.output_text == "It is sunny in Paris."
    third = await turn([{"type": "message", "role": "developer", "content": REMINDER},
                        {"role": "user", "content": [{"type": "input_text",
                                                      "text": FOLLOW_UP}]}])
    await turn([{"type": "function_call_output", "call_id": c.call_id, "output": text}
                for c, text in zip(calls_of(third), RESULTS, strict=True)])
    await turn([{"role": "user", "content": LAST}])
    return replies


def run_chat(client: openai.OpenAI) -> None:
    """:func:`weather_turns` through Chat Completions."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS},
                                      {"role": "user", "content": FIRST}]

    def turn() -> Any:
        reply = client.chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                               tools=WEATHER_TOOLS)  # type: ignore[arg-type]
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        return message

    first = turn()
    messages.append({"role": "tool", "tool_call_id": first.tool_calls[0].id,
                     "content": PARIS})
    turn()
    messages += [{"role": "system", "content": REMINDER},
                 {"role": "user", "content": FOLLOW_UP}]
    third = turn()
    messages += [{"role": "tool", "tool_call_id": c.id, "content": text}
                 for c, text in zip(third.tool_calls, RESULTS, strict=True)]
    turn()
    messages.append({"role": "user", "content": LAST})
    turn()


async def test_plain_text_turn(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    reply = await client_for(gateway.url, sid).responses.create(
        model="m", input="Hi there\nSAY Hello from TITO.")
    assert reply.output_text == "Hello from TITO."
    assert reply.status == "completed" and reply.error is None
    assert reply.id.startswith("resp_") and reply.object == "response"
    reasoning, message = reply.output  # qwen3 thinks by default: an empty reasoning item
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert reasoning.id.startswith("rs_")
    assert message.type == "message" and message.id.startswith("msg_")
    (entry,) = engine_log(engine.url, sid)
    assert reply.usage is not None
    assert reply.usage.input_tokens == len(entry["input_ids"])
    assert reply.usage.output_tokens == len(entry["output_ids"])
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert view(gateway.url, sid)["messages"] == [
        {"role": "user", "content": "Hi there\nSAY Hello from TITO."},
        {"role": "assistant", "content": "Hello from TITO.", "reasoning_content": ""}]
    # the body is a valid Response for the SDK's strict model too (not only its lenient parse)
    resp = httpx.post(f"{gateway.url}/sessions/{new_session(gateway.url)}/v1/responses",
                      json={"input": "SAY Hi.", "instructions": "Be nice.",
                            "metadata": {"k": "v"}, "tools": TOOLS, "store": False})
    assert resp.status_code == 200, resp.text
    body = Response.model_validate(resp.json())
    assert body.output_text == "Hi." and body.instructions == "Be nice."
    assert body.metadata == {"k": "v"} and body.store is False
    assert body.tools[0].name == "get_weather"  # type: ignore[union-attr]


async def test_function_calls_with_full_history(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    replies = await weather_turns(client_for(gateway.url, sid), chained=False)
    first = replies[0]
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    assert first.output[0].summary[0].text == "I need the weather"  # type: ignore[union-attr]
    (call,) = calls_of(first)
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.id is not None and call.id.startswith("fc_") and call.status == "completed"
    assert [c.name for c in calls_of(replies[2])] == ["get_weather", "get_weather"]
    assert replies[3].output_text == "Rainy in London, clear in Tokyo."
    assert replies[4].output_text == "Bye."

    log = engine_log(engine.url, sid)
    assert len(log) == 5
    assert_tito_chain(log)
    state = view(gateway.url, sid)
    assert state["metadata"]["num_turns"] == 5
    assert [r["rolled_back"] for r in state["records"]] == [0] * 5  # every resend matched
    roles = [m["role"] for m in state["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "system", "user",
                     "assistant", "tool", "tool", "assistant", "user", "assistant"]
    stored_call = state["messages"][2]
    assert stored_call == {"role": "assistant", "content": None,
                           "reasoning_content": "I need the weather",
                           "tool_calls": [{"id": call.call_id, "type": "function",
                                           "function": {"name": "get_weather",
                                                        "arguments": call.arguments}}]}


async def test_previous_response_id_gives_the_same_prompts(stack: Any) -> None:
    engine, gateway = stack
    full, chained = new_session(gateway.url), new_session(gateway.url)
    await weather_turns(client_for(gateway.url, full), chained=False)
    replies = await weather_turns(client_for(gateway.url, chained), chained=True)
    assert replies[1].previous_response_id == replies[0].id
    sent = [(e["input_ids"], e["output_ids"]) for e in engine_log(engine.url, full)]
    assert [(e["input_ids"], e["output_ids"]) for e in engine_log(engine.url, chained)] == sent
    assert_tito_chain(engine_log(engine.url, chained))
    assert [r["rolled_back"] for r in view(gateway.url, chained)["records"]] == [0] * 5
    # a retry of the last turn (same previous_response_id) replaces it, as in chat
    client = client_for(gateway.url, chained)
    again = await client.responses.create(model="m", input=[{"role": "user", "content": LAST}],
                                          tools=TOOLS,  # type: ignore[arg-type]
                                          previous_response_id=replies[3].id)
    assert again.output_text == "Bye."
    state = view(gateway.url, chained)
    assert state["metadata"]["num_turns"] == 5 and state["records"][-1]["rolled_back"] == 1


@pytest.mark.parametrize("chained", [False, True])
async def test_streamed_turns_equal_unstreamed_ones(stack: Any, chained: bool) -> None:
    engine, gateway = stack
    sid, streamed_sid = new_session(gateway.url), new_session(gateway.url)
    plain = await weather_turns(client_for(gateway.url, sid), chained=chained)
    streamed = await weather_turns(client_for(gateway.url, streamed_sid), chained=chained,
                                   stream=True)
    for a, b in zip(plain, streamed, strict=True):
        assert a.output_text == b.output_text and a.status == b.status
        assert [(o.type, getattr(o, "name", None), getattr(o, "arguments", None))
                for o in a.output] == \
            [(o.type, getattr(o, "name", None), getattr(o, "arguments", None))
             for o in b.output]
    log = engine_log(engine.url, streamed_sid)
    assert all(entry["stream"] for entry in log)
    assert_tito_chain(log)
    assert samples_identical(sample_of(gateway.url, sid), sample_of(gateway.url, streamed_sid))


async def test_sample_equals_chat_completions(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    await weather_turns(client_for(gateway.url, sid), chained=False)
    chat_sid = new_session(gateway.url)
    run_chat(openai.OpenAI(base_url=f"{gateway.url}/sessions/{chat_sid}/v1", api_key="x",
                           max_retries=0))
    assert [e["input_ids"] for e in engine_log(engine.url, sid)] == \
        [e["input_ids"] for e in engine_log(engine.url, chat_sid)]
    assert samples_identical(sample_of(gateway.url, sid), sample_of(gateway.url, chat_sid))


@pytest.mark.parametrize(("body", "code", "expected"), [
    ({"previous_response_id": "resp_unknown"}, "previous_response_not_found",
     "previous response 'resp_unknown' is not known"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]},
     "unsupported_content", "input[0].content[1] is an image, and the gateway renders "
                            "text only; start tito serve with --images placeholder"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_file", "file_id": "file_1"}]}]},
     "invalid_request", "files and audio are not supported"),
    ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "unsupported_tool",
     "tools.0 has type 'custom', which is not supported"),
    ({"tools": [{"type": "namespace", "name": "ns", "description": "",
                 "tools": [{"type": "custom", "name": "x"}]}]}, "unsupported_tool",
     "tools.0.tools.0 has type 'custom', which is not supported"),
    ({"conversation": "conv_1"}, "unsupported_parameter",
     "conversation is not supported on /v1/responses"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "unsupported_item",
     "input item 0 has type 'item_reference'"),
    ({"max_output_tokens": True}, "invalid_request", "max_output_tokens"),
])
async def test_bad_requests_are_400_and_leave_the_session(stack: Any, body: dict[str, Any],
                                                          code: str, expected: str) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    first = await client.responses.create(model="m", input="SAY One.")
    before = view(gateway.url, sid)
    request = {"model": "m", "input": "SAY Two.", "previous_response_id": first.id, **body}
    resp = httpx.post(f"{gateway.url}/sessions/{sid}/v1/responses", json=request)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == code
    assert error["param"] is None and expected in error["message"]
    with pytest.raises(openai.BadRequestError) as caught:  # the SDK reads it as such
        await client.responses.create(**request)
    assert caught.value.code == code
    after = view(gateway.url, sid)
    assert after["messages"] == before["messages"] and after["records"] == before["records"]
    assert len(engine_log(engine.url, sid)) == 1
    # the session goes on as if the bad requests never came
    second = await client.responses.create(model="m", input="SAY Two.",
                                           previous_response_id=first.id)
    assert second.output_text == "Two."
    assert_tito_chain(engine_log(engine.url, sid))


async def test_previous_response_of_another_session_is_unknown(stack: Any) -> None:
    _, gateway = stack
    other = await client_for(gateway.url, new_session(gateway.url)).responses.create(
        model="m", input="SAY Elsewhere.")
    with pytest.raises(openai.BadRequestError) as caught:
        await client_for(gateway.url, new_session(gateway.url)).responses.create(
            model="m", input="SAY Here.", previous_response_id=other.id)
    assert caught.value.code == "previous_response_not_found"


async def test_max_output_tokens_is_incomplete(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    reply = await client_for(gateway.url, sid).responses.create(
        model="m", input="Go on.\nLONG 40", max_output_tokens=8)
    assert reply.status == "incomplete" and reply.max_output_tokens == 8
    assert reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage is not None and reply.usage.output_tokens == 8
    (entry,) = engine_log(engine.url, sid)
    assert entry["sampling_params"]["max_new_tokens"] == 8


async def test_reasoning_effort_none_switches_thinking_off(stack: Any) -> None:
    engine, gateway = stack
    on, off = new_session(gateway.url), new_session(gateway.url)
    text = "THINK hmm\nSAY Hello."
    thinking = await client_for(gateway.url, on).responses.create(model="m", input=text)
    plain = await client_for(gateway.url, off).responses.create(
        model="m", input=text, reasoning={"effort": "none"})
    assert [item.type for item in thinking.output] == ["reasoning", "message"]
    assert [item.type for item in plain.output] == ["message"]
    assert plain.output_text.strip() == "Hello."
    (with_think,), (without,) = engine_log(engine.url, on), engine_log(engine.url, off)
    assert len(without["input_ids"]) > len(with_think["input_ids"])  # the empty think block
    records = view(gateway.url, off)["records"]
    assert records[0]["chat_template_kwargs"] == {"enable_thinking": False}



async def test_v2_continues_a_response_after_a_journal_replay(make_gateway: Any,
                                                              tmp_path: Path) -> None:
    """A v2 tree keeps each node's response id (journaled too): a response the gateway's
    map does not hold, here after a restart, is continued from its node; two
    continuations of one response are siblings."""
    first: Gateway = make_gateway(journal=str(tmp_path), session_version="v2")
    async with asgi_client(first) as http:
        sid = await new_inproc_session(http)
        reply = await openai_for(http, sid).responses.create(model="m", input="hello")
    assert first.journal is not None
    first.journal.close()

    second: Gateway = make_gateway(journal=str(tmp_path), session_version="v2")
    engine: FakeEngine = second.engine  # type: ignore[assignment]
    async with asgi_client(second) as http:
        client = openai_for(http, sid)
        for text in ("more", "other"):
            await client.responses.create(model="m", input=text,
                                          previous_response_id=reply.id)
        nodes = (await http.get(f"/sessions/{sid}")).json()["metadata"]["tree"]["nodes"]
    assert [n["parent"] for n in nodes] == [None, 0, 0]
    assert nodes[0]["response_id"] == reply.id
    before: FakeEngine = first.engine  # type: ignore[assignment]
    prompt = before.calls[0].input_ids  # both continuations extend the stored turn
    assert [c.input_ids[: len(prompt)] for c in engine.calls] == [prompt, prompt]
    assert len(engine.calls[0].input_ids) > len(prompt) + 2
