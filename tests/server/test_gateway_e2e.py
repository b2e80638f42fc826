"""End to end: `tito serve` + `tito mock-engine` processes, the real openai SDK and httpx.

Every turn's TITO invariant is checked on the ids the engine really received (the mock's
request log), and the collected sample is compared with them bit for bit.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from helpers.support import assert_tito_chain, engine_log, new_session

from tito.samples import decode_samples

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "calculator", "description": "Math.",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}},
]




def client_for(gateway_url: str, sid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway_url}/sessions/{sid}/v1", api_key="unused",
                         max_retries=0)


def as_message(choice_message: Any) -> dict[str, Any]:
    """What an agent sends back: the SDK message dumped (reasoning_content included)."""
    return choice_message.model_dump(exclude_none=True)




def collect(gateway_url: str, sid: str, **body: Any) -> Any:
    resp = httpx.post(f"{gateway_url}/sessions/{sid}/samples", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/octet-stream"
    return decode_samples(resp.content)




def test_six_turn_tool_agent_exact_sample(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": 'THINK I need the weather\nCALL get_weather {"city": "Paris"}'},
    ]
    # Turn 1: thinking on, single tool call.
    r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls[0].function.name == "get_weather"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"city": "Paris"}
    assert getattr(msg, "reasoning_content", None) == "I need the weather"
    messages.append(as_message(msg))
    # Turn 2: the tool result asks for two parallel calls.
    messages.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content":
                     'CALL calculator {"expression": "2+2"}\n'
                     'CALL get_weather {"city": "Tokyo"}'})
    r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    msg = r.choices[0].message
    assert [c.function.name for c in msg.tool_calls] == ["calculator", "get_weather"]
    messages.append(as_message(msg))
    # Turn 3: two tool results, thinking off for this request.
    messages += [{"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "4"},
                 {"role": "tool", "tool_call_id": msg.tool_calls[1].id,
                  "content": "SAY It is 4, and sunny in Tokyo."}]
    r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                       extra_body={"chat_template_kwargs":
                                                   {"enable_thinking": False}})
    assert r.choices[0].message.content == "It is 4, and sunny in Tokyo."
    assert r.choices[0].finish_reason == "stop"
    messages.append(as_message(r.choices[0].message))
    # Turn 4: a user follow-up.
    messages.append({"role": "user", "content": "THINK follow up\nSAY Anything else?"})
    r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    messages.append(as_message(r.choices[0].message))
    # Turn 5: a system reminder + user.
    messages += [{"role": "system", "content": "Reminder: be brief."},
                 {"role": "user", "content": "SAY Brief."}]
    r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    messages.append(as_message(r.choices[0].message))
    # Turn 6: plain user turn with the default reply.
    messages.append({"role": "user", "content": "thanks"})
    r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert r.usage.completion_tokens > 0

    log = [e for e in engine_log(engine.url) if e["rid"].startswith(sid)]
    assert len(log) == 6
    assert_tito_chain(log)
    assert {e["routing_key"] for e in log} == {sid}  # SGLang's router keeps it on one engine
    # Turn 3 ran with thinking off: its prompt ends with the empty think block.
    assert log[2]["input_ids"][-4:] != log[3]["input_ids"][-4:]

    decoded = collect(gateway.url, sid)
    assert decoded.empty_reason is None and len(decoded.samples) == 1
    sample = decoded.samples[0]
    final = log[-1]["input_ids"] + log[-1]["output_ids"]
    assert sample.tokens.dtype == np.int64 and sample.tokens.tolist() == final
    assert sample.status == "completed"
    prompt0 = len(log[0]["input_ids"])
    assert sample.response_length == len(final) - prompt0
    # Loss mask is 1 exactly on generated positions; logprobs equal the engine's.
    expected_mask = np.zeros(len(final), dtype=np.uint8)
    expected_lp = np.zeros(len(final), dtype=np.float32)
    for entry in log:
        start = len(entry["input_ids"])
        end = start + len(entry["output_ids"])
        expected_mask[start:end] = 1
        expected_lp[start:end] = np.asarray(entry["logprobs"], dtype=np.float32)
    assert sample.loss_mask.tolist() == expected_mask[prompt0:].tolist()
    assert np.array_equal(sample.rollout_log_probs, expected_lp[prompt0:])
    strict_classes = ("special_token_count", "special_token_type", "non_assistant_text")
    mismatches = sample.metadata["tito_session_mismatch"]
    assert not [m for m in mismatches if m["type"] in strict_classes], mismatches
    assert decoded.session_metadata["num_turns"] == 6


def accumulate(chunks: list[Any]) -> tuple[Any, Any, list[Any], Any]:
    """(content, reasoning, [(index, name, arguments)], finish_reason) of a streamed
    completion, its deltas put together as a client does."""
    content, reasoning, finish = "", "", None
    calls: dict[int, list[Any]] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, [None, ""])
            entry[0] = entry[0] or call.function.name
            entry[1] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return (content or None, reasoning or None,
            [(i, name, json.loads(args)) for i, (name, args) in sorted(calls.items())], finish)


def test_stream_and_non_stream_equivalent(stack: Any) -> None:
    _engine, gateway = stack
    prompt = [{"role": "user", "content": 'THINK hmm, two tools\nSAY Let me check.\n'
               'CALL get_weather {"city": "Oslo"}\nCALL calculator {"expression": "1+1"}'}]
    results = []
    for stream in (False, True):
        sid = new_session(gateway.url)
        client = client_for(gateway.url, sid)
        if stream:
            chunks = list(client.chat.completions.create(model="m", messages=prompt,
                                                         tools=TOOLS, stream=True))
            assert len(chunks) > 3  # role, text deltas, tool calls, finish
            results.append(accumulate(chunks))
        else:
            r = client.chat.completions.create(model="m", messages=prompt, tools=TOOLS)
            m = r.choices[0].message
            calls = [(i, c.function.name, json.loads(c.function.arguments))
                     for i, c in enumerate(m.tool_calls)]
            results.append((m.content, getattr(m, "reasoning_content", None), calls,
                            r.choices[0].finish_reason))
    assert results[0] == results[1]
    assert results[0][2][1][1] == "calculator" and results[0][3] == "tool_calls"


def test_stream_include_usage_raw_sse(stack: Any) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    resp = httpx.post(f"{gateway.url}/sessions/{sid}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "SAY hi"}], "stream": True,
        "stream_options": {"include_usage": True}})
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in resp.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] > 0
    assert json.loads(events[-3])["choices"][0]["finish_reason"] == "stop"
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                   for e in events[:-2])
    assert text == "hi"


def test_retry_rollback_first_and_later_turns(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    u1 = {"role": "user", "content": "SAY one"}
    client.chat.completions.create(model="m", messages=[u1])
    # Retry the first turn with another system prompt (the same opening user message):
    # rolls back to the empty session. (Another opening would be another conversation.)
    s1 = {"role": "system", "content": "Be brief."}
    r = client.chat.completions.create(model="m", messages=[s1, u1])
    a1 = as_message(r.choices[0].message)
    r = client.chat.completions.create(model="m", messages=[s1, u1, a1,
                                                            {"role": "user", "content": "SAY 2"}])
    a2 = as_message(r.choices[0].message)
    # Retry turn 2 with another user message: one-step rollback.
    client.chat.completions.create(model="m", messages=[s1, u1, a1,
                                                        {"role": "user", "content": "SAY dos"}])
    info = httpx.get(f"{gateway.url}/sessions/{sid}?include_messages=true").json()
    assert info["metadata"]["num_turns"] == 2 and "contexts" not in info["metadata"]
    assert [m["content"] for m in info["messages"]] == ["Be brief.", "SAY one", "one",
                                                         "SAY dos", "dos"]
    assert a2["content"] == "2"
    log = [e for e in engine_log(engine.url) if e["rid"].startswith(sid)]
    assert log[3]["input_ids"][: len(log[1]["input_ids"]) + len(log[1]["output_ids"])] == \
        log[1]["input_ids"] + log[1]["output_ids"]


def snapshot_state(gateway_url: str, sid: str) -> Any:
    resp = httpx.get(f"{gateway_url}/sessions/{sid}",
                     params={"include_ids": "true", "include_messages": "true"})
    body = resp.json()
    for rec in body["records"]:
        rec.pop("request_ts"), rec.pop("commit_ts")
    body["metadata"].pop("last_active")
    return body


def three_turn_session(gateway_url: str) -> tuple[str, openai.OpenAI, list[dict[str, Any]]]:
    """A session with three committed turns, its client and the replayable history."""
    sid = new_session(gateway_url)
    client = client_for(gateway_url, sid)
    msgs: list[dict[str, Any]] = []
    for i in range(3):
        msgs.append({"role": "user", "content": f"SAY turn {i}"})
        r = client.chat.completions.create(model="m", messages=msgs)
        msgs.append(as_message(r.choices[0].message))
    return sid, client, msgs


def test_deep_divergence_400_state_identical(stack: Any) -> None:
    _, gateway = stack
    sid, client, msgs = three_turn_session(gateway.url)
    before = snapshot_state(gateway.url, sid)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="m", messages=[*msgs[:2], {"role": "user", "content": "diverge"}])
    body = err.value.body
    assert err.value.status_code == 400 and body["code"] == "rollback_too_deep"
    assert "discard_count=2" in body["message"]
    assert "stored has 6 messages, request has 3 messages" in body["message"]
    assert snapshot_state(gateway.url, sid) == before
    msgs.append({"role": "user", "content": "SAY still fine"})
    client.chat.completions.create(model="m", messages=msgs)


BAD_INPUTS = [
    ("non-json", b"{not json", 400, "invalid_json"),
    ("empty", b"", 400, "invalid_json"),
    ("array", b"[1, 2]", 400, "invalid_request"),
    ("no messages", json.dumps({"model": "m"}).encode(), 400, "invalid_request"),
    ("wrong type", json.dumps({"messages": "hi"}).encode(), 400, "invalid_request"),
    ("bad role", json.dumps({"messages": [{"role": "ipython", "content": "x"}]}).encode(),
     400, "invalid_request"),
    ("kwargs not object", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                      "chat_template_kwargs": [1]}).encode(),
     400, "invalid_template_kwargs"),
    ("pinned kwarg", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                 "chat_template_kwargs": {"clear_thinking": True}}).encode(),
     400, "template_kwarg_conflict"),
    ("n>1", json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(),
     400, "invalid_request"),
    ("temperature", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                "temperature": "hot"}).encode(), 400, "invalid_request"),
    ("image part", json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}).encode(), 400,
     "unsupported_content"),
    ("audio part", json.dumps({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "x"}}]}]}).encode(), 400,
     "invalid_request"),
    ("oversize", b'{"messages": [{"role": "user", "content": "' + b"x" * 2_100_000 + b'"}]}',
     413, "payload_too_large"),
]


@pytest.mark.parametrize("name,body,status,code", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_4xx_state_unchanged(stack: Any, name: str, body: bytes, status: int,
                                        code: str) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    first = [{"role": "user", "content": "SAY first"}]
    r = client.chat.completions.create(model="m", messages=first)
    before = snapshot_state(gateway.url, sid)
    resp = httpx.post(f"{gateway.url}/sessions/{sid}/v1/chat/completions", content=body,
                      headers={"content-type": "application/json"})
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]
    assert snapshot_state(gateway.url, sid) == before
    # The session still works afterwards.
    client.chat.completions.create(model="m", messages=[
        *first, as_message(r.choices[0].message), {"role": "user", "content": "SAY ok"}])


def test_unknown_session_and_routes(stack: Any) -> None:
    _, gateway = stack
    missing = "0" * 32
    for method, path in [("GET", ""), ("DELETE", ""), ("POST", "/samples"),
                         ("POST", "/v1/chat/completions"), ("GET", "/v1/models")]:
        resp = httpx.request(method, f"{gateway.url}/sessions/{missing}{path}",
                             json={"messages": [{"role": "user", "content": "x"}]})
        assert resp.status_code == 404, (method, path)
        assert resp.json()["error"]["code"] == "session_not_found"
    sid = new_session(gateway.url)
    resp = httpx.get(f"{gateway.url}/sessions/{sid}/v1/embeddings")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "unknown_route"
    assert httpx.get(gateway.url + "/nope").json()["error"]["code"] == "unknown_route"


def test_session_lifecycle_models_health_metrics(stack: Any) -> None:
    _, gateway = stack
    health = httpx.get(gateway.url + "/health").json()
    assert health["status"] == "ok" and health["family"] == "qwen3"
    assert health["capabilities"]["append_only_verified"] is True
    assert len(health["instance_id"]) == 32
    assert health["session_server_instance_id"] == health["instance_id"]  # reference name
    sid = new_session(gateway.url)
    models = client_for(gateway.url, sid).models.list()
    assert models.data[0].id == "tito-qwen3"
    info = httpx.get(f"{gateway.url}/sessions/{sid}").json()
    assert info["records"] == [] and info["session_id"] == sid
    assert httpx.delete(f"{gateway.url}/sessions/{sid}").status_code == 204
    assert httpx.delete(f"{gateway.url}/sessions/{sid}").status_code == 410
    gone = httpx.get(f"{gateway.url}/sessions/{sid}")
    assert gone.status_code == 410 and gone.json()["error"]["code"] == "session_gone"
    metrics = httpx.get(gateway.url + "/metrics").text
    assert "tito_sessions_created_total" in metrics and "tito_errors_total" in metrics


def test_samples_truncation_and_empty_reasons(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    assert collect(gateway.url, sid).empty_reason == "no_records"
    client = client_for(gateway.url, sid)
    msgs = [{"role": "user", "content": "SAY alpha beta gamma"}]
    r = client.chat.completions.create(model="m", messages=msgs)
    msgs += [as_message(r.choices[0].message), {"role": "user", "content": "SAY delta epsilon"}]
    client.chat.completions.create(model="m", messages=msgs)
    log = [e for e in engine_log(engine.url) if e["rid"].startswith(sid)]
    prompt0 = len(log[0]["input_ids"])
    assert collect(gateway.url, sid, max_seq_len=prompt0).empty_reason == "all_truncated"
    cut = len(log[1]["input_ids"]) + 2  # two tokens into turn 2's output
    decoded = collect(gateway.url, sid, max_seq_len=cut)
    sample = decoded.samples[0]
    assert sample.status == "truncated" and len(sample.tokens) == cut
    assert sample.tokens.tolist() == (log[1]["input_ids"] + log[1]["output_ids"])[:cut]
    full = collect(gateway.url, sid, max_seq_len=None, metadata={"reward": 1})
    assert full.samples[0].status == "completed"
    assert full.samples[0].metadata["reward"] == 1
    for bad in ({"max_seq_len": "x"}, {"max_seq_len": 0}, {"metadata": [1]}, {"other": 1}):
        resp = httpx.post(f"{gateway.url}/sessions/{sid}/samples", json=bad)
        assert resp.status_code == 400, bad
    resp = httpx.post(f"{gateway.url}/sessions/{sid}/samples", content=b"{bad")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"


def test_length_finish_and_extension(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    msgs = [{"role": "user", "content": "LONG 50"}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=8)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    msgs += [as_message(r.choices[0].message), {"role": "user", "content": "SAY after"}]
    client.chat.completions.create(model="m", messages=msgs)
    log = [e for e in engine_log(engine.url) if e["rid"].startswith(sid)]
    assert_tito_chain(log)
    sample = collect(gateway.url, sid).samples[0]
    assert sample.status == "completed"  # the last turn's; the cut turn is in the sample
    assert sample.tokens.tolist() == log[1]["input_ids"] + log[1]["output_ids"]
    start = len(log[0]["input_ids"])
    assert sample.metadata["length_cut_turns"] == [{"turn": 0, "start": start,
                                                    "end": start + 8}]


def test_get_session_pages_are_bounded(stack: Any) -> None:
    _, gateway = stack
    sid, _, _ = three_turn_session(gateway.url)
    url = f"{gateway.url}/sessions/{sid}"
    first = httpx.get(url, params={"limit": 2}).json()
    assert [r["turn"] for r in first["records"]] == [0, 1]
    assert first["page"]["next_offset"] == 2 and first["page"]["total"] == 3
    last = httpx.get(url, params={"offset": 2, "include_ids": "true"}).json()
    assert [r["turn"] for r in last["records"]] == [2] and last["page"]["next_offset"] is None
    assert len(last["records"][0]["output_ids"]) == last["records"][0]["output_len"]
    for bad in ({"limit": 0}, {"limit": 5000}, {"offset": -1}, {"offset": "x"}):
        resp = httpx.get(url, params=bad)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_request"


def test_samples_without_response_text(stack: Any) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    client.chat.completions.create(model="m", messages=[
        {"role": "user", "content": "SAY " + "many words here " * 20}])
    full = httpx.post(f"{gateway.url}/sessions/{sid}/samples", json={}).content
    lean = httpx.post(f"{gateway.url}/sessions/{sid}/samples",
                      json={"include_response": False}).content
    with_text, without = decode_samples(full).samples[0], decode_samples(lean).samples[0]
    assert "many words here" in with_text.response and without.response is None
    assert without.tokens.tolist() == with_text.tokens.tolist()
    assert len(lean) < len(full)
    resp = httpx.post(f"{gateway.url}/sessions/{sid}/samples", json={"include_response": 0})
    assert resp.status_code == 400 and "include_response" in resp.json()["error"]["message"]
