"""Harnesses that re-serialize history, through the real SDK against the real gateway:
what the default matcher tolerates is counted, a discarded turn is visible, and a client
that rewrites the model's reply or changes its tools is told why (design §5.3)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from helpers.support import new_session

from tito.samples import decode_samples

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def client_for(url: str, sid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="unused",
                         max_retries=0)


def samples_of(url: str, sid: str) -> Any:
    resp = httpx.post(f"{url}/sessions/{sid}/samples", json={})
    assert resp.status_code == 200, resp.text
    return decode_samples(resp.content)


def metric(url: str, line: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    found = [row for row in text.splitlines() if row.startswith(line + " ")]
    return float(found[0].split()[-1]) if found else 0.0


def reserialized(message: Any) -> dict[str, Any]:
    """What LangChain, pydantic-ai or the Agents SDK send back: no reasoning, arguments
    dumped compactly, another call id."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {
            "name": c.function.name,
            "arguments": json.dumps(json.loads(c.function.arguments), separators=(",", ":"))}}
            for i, c in enumerate(message.tool_calls)]
    return out


def test_every_call_of_a_reserializing_harness_is_in_the_sample(stack: Any) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    before = metric(gateway.url, 'tito_tolerated_total{kind="reasoning_dropped"}')
    messages: list[dict[str, Any]] = [{"role": "user", "content":
                                       'THINK look it up\nCALL get_weather {"city": "Paris"}'}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    messages += [reserialized(reply.choices[0].message),
                 {"role": "tool", "tool_call_id": "call_0",
                  "content": "THINK it is warm\nSAY 21 degrees."}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    messages += [reserialized(reply.choices[0].message),
                 {"role": "user", "content": "SAY Bye."}]
    client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    decoded = samples_of(gateway.url, sid)
    meta = decoded.samples[0].metadata
    assert meta["num_turns"] == 3 and len(meta["lifecycle"]) == 3  # 3 calls, 3 turns
    assert "tito_discarded_turns" not in meta and meta["tito_session_mismatch"] == []
    assert meta["tito_tolerated"] == [  # qwen3 renders no call ids: a new one is tolerated
        {"turn": 1, "reasoning_dropped": 1, "arguments_reformatted": 1, "call_id_changed": 1},
        {"turn": 2, "reasoning_dropped": 1}]
    after = metric(gateway.url, 'tito_tolerated_total{kind="reasoning_dropped"}')
    assert after - before == 2


def test_a_retry_that_discards_a_turn_is_visible(stack: Any) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    before = metric(gateway.url, "tito_discarded_turns_total")
    first = [{"role": "user", "content": "SAY one"}]
    reply = client.chat.completions.create(model="m", messages=first)
    again = [*first, {"role": "assistant", "content": reply.choices[0].message.content},
             {"role": "user", "content": "SAY two"}]
    client.chat.completions.create(model="m", messages=again)
    client.chat.completions.create(model="m", messages=again)  # the agent retried
    meta = samples_of(gateway.url, sid).samples[0].metadata
    assert meta["num_turns"] == 2
    assert meta["tito_discarded_turns"] == [
        {"turn": 1, "discarded": 1, "message": 3, "role": None, "fields": []}]
    assert metric(gateway.url, "tito_discarded_turns_total") - before == 1


def test_a_rewritten_reply_and_changed_tools_are_refused_with_the_reason(stack: Any) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    first = [{"role": "user", "content": 'CALL get_weather {"city": "Paris"}'}]
    reply = client.chat.completions.create(model="m", messages=first, tools=TOOLS)
    call = reply.choices[0].message.tool_calls[0]
    as_text = [*first, {"role": "assistant", "content": f"Action: {call.function.arguments}"},
               {"role": "user", "content": "Observation: 21"}]  # smolagents' shape
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=as_text, tools=TOOLS)
    assert info.value.code == "history_rewritten"
    assert "--session-version v2" in str(info.value.message)
    echoed = [*first, reserialized(reply.choices[0].message),
              {"role": "tool", "tool_call_id": "call_0", "content": "21"}]
    more = [*TOOLS, {"type": "function", "function": {"name": "search", "parameters": {}}}]
    with pytest.raises(openai.BadRequestError, match="added search") as info:
        client.chat.completions.create(model="m", messages=echoed, tools=more)
    assert info.value.code == "render_changed"
    view = httpx.get(f"{gateway.url}/sessions/{sid}").json()
    assert view["page"]["total"] == 1  # the session is as it was
    client.chat.completions.create(model="m", messages=echoed, tools=TOOLS)
    assert samples_of(gateway.url, sid).samples[0].metadata["num_turns"] == 2


async def test_a_discarded_turn_is_logged_with_where_it_left_the_path(
        make_gateway: Any, caplog: pytest.LogCaptureFixture) -> None:
    from tito.types.engine import SamplingParams
    from tito.types.messages import TurnRequest

    gateway = make_gateway()
    session = gateway.store.create()
    first = [{"role": "user", "content": "SAY one"}]
    outcome = await gateway.run_turn(session, TurnRequest(list(first)), SamplingParams())
    edited = [*first, {**outcome.parsed.to_message(), "content": "edited"}]
    with caplog.at_level("WARNING", logger="tito.server"):
        await gateway.run_turn(session, TurnRequest(edited), SamplingParams())
    lines = [r.getMessage() for r in caplog.records if "discarded" in r.getMessage()]
    assert len(lines) == 1 and session.session_id in lines[0]
    assert "discarded 1 generated turn(s)" in lines[0] and "message 1 (content differ)" in lines[0]


async def test_v2_keeps_a_reply_that_the_client_went_on_after_in_a_rewritten_copy(
        make_gateway: Any) -> None:
    """smolagents' shape in v2: the rewritten reply is not a retry of it, so both leaves
    are samples (a real retry of the same request still supersedes)."""
    from tito.server.samples import samples_payload
    from tito.types.engine import SamplingParams
    from tito.types.messages import TurnRequest

    gateway = make_gateway(session_version="v2")
    session = gateway.store.create()
    params = SamplingParams()
    u1 = {"role": "user", "content": "SAY hi"}
    a1 = (await gateway.run_turn(session, TurnRequest([u1], tools=TOOLS),
                                 params)).parsed.to_message()
    u2 = {"role": "user", "content": 'CALL get_weather {"city": "Paris"}'}
    await gateway.run_turn(session, TurnRequest([u1, a1, u2], tools=TOOLS), params)
    rewritten = [u1, a1, u2, {"role": "assistant", "content": "Action: get_weather(Paris)"},
                 {"role": "user", "content": "Observation: 21\nSAY done"}]
    await gateway.run_turn(session, TurnRequest(rewritten, tools=TOOLS), params)
    tree = session.agent_context("main")
    assert [n.parent for n in tree.nodes] == [None, 0, 0]
    assert tree.nodes[2].record.request["rewrote"] == [1]
    decoded = decode_samples(await samples_payload(gateway, session, None, None))
    assert sorted(s.metadata["leaf"]["node_id"] for s in decoded.samples) == [1, 2]
    await gateway.run_turn(session, TurnRequest(rewritten, tools=TOOLS), params)  # a retry
    decoded = decode_samples(await samples_payload(gateway, session, None, None))
    assert sorted(s.metadata["leaf"]["node_id"] for s in decoded.samples) == [1, 3]
