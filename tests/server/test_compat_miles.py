"""The reference framework's HTTP expectations of its session server (docs/miles.md),
rewritten as our own tests and run against ``tito serve`` in both modes.

``--compat miles`` meets every one. The default mode meets them too except where tito
differs on purpose (docs/miles.md, "Differences that remain on purpose"): each such case
asserts our behaviour explicitly, so a difference that disappears or a new one fails here.
Expectations that read the reference mock's internals (its request log, patched replies)
are left out; tito's own tests cover those behaviours.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from helpers.support import Proc, start_gateway, tokenizer_dir

from tito.samples import decode_samples

pytestmark = pytest.mark.slow  # real processes per case (fast tier: under a minute)

U1 = {"role": "user", "content": "What is 1+2?\nSAY three"}
T1 = {"role": "tool", "content": "tool-result-1\nSAY done", "tool_call_id": "t0"}
T1_DIFF = {"role": "tool", "content": "tool-result-DIFFERENT\nSAY done", "tool_call_id": "t0"}
TOOLS = [{"type": "function", "function": {
    "name": name, "parameters": {"type": "object", "properties": {arg: {"type": "string"}}}}}
    for name, arg in (("get_weather", "city"), ("get_time", "timezone"))]
TWO_CALLS = ('What now?\nCALL get_weather {"city": "Beijing"}\n'
             'CALL get_time {"timezone": "UTC"}')


@dataclass
class Env:
    url: str
    miles: bool

    def new(self) -> str:
        resp = httpx.post(f"{self.url}/sessions")
        assert resp.status_code == 200
        return str(resp.json()["session_id"])

    def chat(self, sid: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}/sessions/{sid}/v1/chat/completions", json=body,
                          timeout=30.0)

    def turn(self, sid: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        resp = self.chat(sid, {"messages": messages})
        assert resp.status_code == 200, resp.text
        return dict(resp.json()["choices"][0]["message"])

    def get(self, sid: str) -> dict[str, Any]:
        """The session as the reference lists it: in the default mode, records carry
        ``request``/``response`` only when asked (``include_requests``)."""
        query = "" if self.miles else "?include_requests=1"
        resp = httpx.get(f"{self.url}/sessions/{sid}{query}")
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def error_text(self, resp: httpx.Response, code: str) -> str:
        """The error's text: the reference's ``{"error": text}`` under ``--compat miles``;
        OpenAI's envelope with its ``code`` in the default mode."""
        error = resp.json()["error"]
        if self.miles:
            assert isinstance(error, str)
            return error
        assert error["code"] == code
        return str(error["message"])


@pytest.fixture(scope="module")
def miles_gateway(qwen3_stack: tuple[Proc, Proc]) -> Iterator[Proc]:
    engine, _ = qwen3_stack
    gateway = start_gateway(engine.url, tokenizer_dir("qwen3"), "qwen3", "--compat", "miles")
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(params=["default", "miles"])
def env(request: pytest.FixtureRequest, qwen3_stack: tuple[Proc, Proc]) -> Env:
    if request.param == "miles":
        return Env(request.getfixturevalue("miles_gateway").url, miles=True)
    return Env(qwen3_stack[1].url, miles=False)


def sse_data(body: str) -> list[str]:
    return [block[len("data: "):] for block in body.split("\n\n") if block.startswith("data: ")]


# -- session routes ---------------------------------------------------------------------------
def test_health_reports_a_stable_instance_id(env: Env) -> None:
    first, second = (httpx.get(f"{env.url}/health") for _ in range(2))
    assert first.status_code == second.status_code == 200
    assert first.json()["status"] == "ok"
    instance = first.json()["session_server_instance_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", instance)
    assert second.json()["session_server_instance_id"] == instance


def test_create_and_get_an_empty_session(env: Env) -> None:
    sid = env.new()
    assert len(sid) == 32
    body = env.get(sid)
    assert body["session_id"] == sid and body["records"] == []


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_unknown_session_is_404_with_the_reference_text(env: Env, method: str) -> None:
    resp = httpx.request(method, f"{env.url}/sessions/nonexistent")
    assert resp.status_code == 404
    assert env.error_text(resp, "session_not_found") == \
        "session not found: session_id=nonexistent"


def test_delete_then_delete_again(env: Env) -> None:
    sid = env.new()
    first = httpx.delete(f"{env.url}/sessions/{sid}")
    assert first.status_code == 204 and first.text == ""
    again = httpx.delete(f"{env.url}/sessions/{sid}")
    chat = env.chat(sid, {"messages": [U1]})
    if env.miles:
        for resp in (again, chat):
            assert resp.status_code == 404
            assert resp.json() == {"error": f"session not found: session_id={sid}"}
    else:  # deliberate: "collected, too late" is not "never existed"
        for resp in (again, chat):
            assert resp.status_code == 410
            assert resp.json()["error"]["code"] == "session_gone"


# -- chat turns ---------------------------------------------------------------------------------
def test_a_turn_appends_a_record_with_path_and_status(env: Env) -> None:
    sid = env.new()
    assert env.chat(sid, {"messages": [U1], "temperature": 0.0}).status_code == 200
    [record] = env.get(sid)["records"]
    assert record["path"] == "/v1/chat/completions"
    assert record["status_code"] == 200
    assert record["request"]["messages"] == [U1]
    assert record["request"]["temperature"] == 0.0
    assert record["response"]["choices"][0]["message"]["content"] == "three"


def test_records_carry_request_and_response_only_when_asked_by_default(env: Env) -> None:
    sid = env.new()
    env.turn(sid, [U1])
    [record] = httpx.get(f"{env.url}/sessions/{sid}").json()["records"]
    if env.miles:
        assert record["request"]["messages"] == [U1]
    else:  # deliberate: the messages make a records page grow with turns x history
        assert "request" not in record and "response" not in record


def test_one_server_and_one_date_header(env: Env) -> None:
    sid = env.new()
    host, port = env.url.removeprefix("http://").split(":")
    body = json.dumps({"messages": [U1]})
    raw_request = (f"POST /sessions/{sid}/v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                   f"Connection: close\r\n\r\n{body}")
    with socket.create_connection((host, int(port)), timeout=30.0) as sock:
        sock.sendall(raw_request.encode())
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = sock.recv(4096)
            assert chunk, "closed before the headers ended"
            raw += chunk
    head = raw.split(b"\r\n\r\n", 1)[0].decode().splitlines()
    assert head[0].endswith("200 OK")
    names = [line.split(":", 1)[0].lower() for line in head[1:]]
    assert names.count("server") <= 1 and names.count("date") <= 1


def test_malformed_json_is_400_invalid_json_body(env: Env) -> None:
    resp = httpx.post(f"{env.url}/sessions/{env.new()}/v1/chat/completions",
                      content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert env.error_text(resp, "invalid_json").startswith("invalid JSON body:")


def test_reply_meta_info_without_replay_payloads(env: Env) -> None:
    sid = env.new()
    plain = env.chat(sid, {"messages": [U1]}).json()["choices"][0]
    if env.miles:
        meta = plain["meta_info"]
    else:  # deliberate: only on request (SGLang's return_meta_info)
        assert "meta_info" not in plain
        meta = env.chat(env.new(), {"messages": [U1], "return_meta_info": True}
                        ).json()["choices"][0]["meta_info"]
    assert "routed_experts" not in meta and "indexer_topk" not in meta
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] > 0
    record_meta = env.get(sid)["records"][0]["response"]["choices"][0]["meta_info"]
    assert record_meta["output_token_logprobs"] == meta["output_token_logprobs"]


# -- streaming ----------------------------------------------------------------------------------
def test_stream_matches_the_unstreamed_reply(env: Env) -> None:
    plain_sid, stream_sid = env.new(), env.new()
    plain = env.chat(plain_sid, {"messages": [U1]}).json()
    resp = env.chat(stream_sid, {"messages": [U1], "stream": True,
                                 "stream_options": {"include_usage": True}})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_data(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == plain["model"]
               for c in chunks)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert not any("meta_info" in c for c in choices)
    if env.miles:
        assert len(events) == 2
        [choice] = choices
        assert choice["delta"]["role"] == "assistant"
        content = choice["delta"]["content"]
    else:  # deliberate: real token streaming
        assert len(events) > 2
        content = "".join(c["delta"].get("content") or "" for c in choices)
    assert content == plain["choices"][0]["message"]["content"]
    assert choices[-1]["finish_reason"] == "stop"
    stream_record, plain_record = (env.get(s)["records"][0] for s in (stream_sid, plain_sid))
    assert stream_record["request"] == plain_record["request"]
    assert stream_record["response"]["choices"][0]["message"] == \
        plain_record["response"]["choices"][0]["message"]


def test_streamed_tool_calls_carry_their_index(env: Env) -> None:
    resp = env.chat(env.new(), {"messages": [{"role": "user", "content": TWO_CALLS}],
                                "tools": TOOLS, "stream": True})
    assert resp.status_code == 200
    chunks = [json.loads(e) for e in sse_data(resp.text)[:-1]]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[-1]["finish_reason"] == "tool_calls"
    deltas = [call for c in choices for call in c["delta"].get("tool_calls") or ()]
    if env.miles:  # one chunk, each call whole
        assert len(choices) == 1
        calls = deltas
    else:  # deliberate: a call's name, then its arguments, under its index
        calls = []
        for delta in deltas:
            if delta["index"] == len(calls):
                calls.append({"index": delta["index"], "function": dict(delta["function"])})
            else:
                calls[delta["index"]]["function"]["arguments"] += \
                    delta["function"].get("arguments", "")
    assert [call["index"] for call in calls] == [0, 1]
    assert [call["function"]["name"] for call in calls] == ["get_weather", "get_time"]
    for call in calls:
        json.loads(call["function"]["arguments"])


def test_stream_carries_usage_and_a_length_finish(env: Env) -> None:
    resp = env.chat(env.new(), {"messages": [U1], "stream": True, "max_tokens": 1,
                                "stream_options": {"include_usage": True}})
    assert resp.status_code == 200
    chunks = [json.loads(e) for e in sse_data(resp.text)[:-1]]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[-1]["finish_reason"] == "length"
    [usage] = [c["usage"] for c in chunks if c.get("usage")]
    assert usage["completion_tokens"] == 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + 1
    if env.miles:  # the usage rides on the one chunk
        assert len(chunks) == 1


def test_a_failed_stream_is_a_json_error_and_records_nothing(env: Env) -> None:
    """The reference passes its engine's error through (its test: a 400); the engine here
    fails with a 500, which tito answers as a 5xx: JSON, not an event stream, either way."""
    sid = env.new()
    resp = env.chat(sid, {"messages": [{"role": "user", "content": "hi\nFAULT http_500"}],
                          "stream": True})
    assert resp.status_code >= 400
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert isinstance(error, str) if env.miles else isinstance(error["message"], str)
    assert env.get(sid)["records"] == []


def test_stream_false_is_json(env: Env) -> None:
    resp = env.chat(env.new(), {"messages": [U1], "stream": False})
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["choices"][0]["message"]["content"]


def sdk_stream(url: str, sid: str, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The message an OpenAI SDK client rebuilds from the stream, as agents do."""
    client = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="-", max_retries=0)
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                                tools=tools or openai.NOT_GIVEN,  # type: ignore[arg-type]
                                                stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                slot = calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                     "function": {"name": "", "arguments": ""}})
                slot["id"] = call.id or slot["id"]
                slot["function"]["name"] += (call.function and call.function.name) or ""
                slot["function"]["arguments"] += (call.function and call.function.arguments) or ""
            finish = choice.finish_reason or finish
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {"message": message, "finish_reason": finish}


def test_streamed_turns_extend_the_session(env: Env) -> None:
    sid = env.new()
    first = sdk_stream(env.url, sid, [U1])
    assert first["message"]["content"] == "three" and first["finish_reason"] == "stop"
    second = sdk_stream(env.url, sid, [U1, first["message"], T1])
    assert second["message"]["content"] == "done"
    assert len(env.get(sid)["records"]) == 2


def test_streamed_tool_calls_match_the_stored_ones_and_extend(env: Env) -> None:
    sid = env.new()
    ask = {"role": "user", "content": TWO_CALLS}
    first = sdk_stream(env.url, sid, [ask], TOOLS)
    assert first["finish_reason"] == "tool_calls"
    stored = env.get(sid)["records"][0]["response"]["choices"][0]["message"]
    rebuilt = first["message"]["tool_calls"]
    assert [c["function"] for c in rebuilt] == [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in stored["tool_calls"]]
    assert [c["id"] for c in rebuilt] == [c["id"] for c in stored["tool_calls"]]
    results = [{"role": "tool", "content": "sunny\nSAY Final answer after tool.",
                "tool_call_id": c["id"]} for c in rebuilt]
    second = sdk_stream(env.url, sid, [ask, first["message"], *results], TOOLS)
    assert second["message"]["content"] == "Final answer after tool."
    assert len(env.get(sid)["records"]) == 2


# -- v1 retries and rollbacks (the reference's pins) ------------------------------------------
def two_turns(env: Env) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A session holding [U1, a1, T1, a2] in two records."""
    sid = env.new()
    a1 = env.turn(sid, [U1])
    a2 = env.turn(sid, [U1, a1, T1])
    assert len(env.get(sid)["records"]) == 2
    return sid, a1, a2


def test_pure_drop_retry_rolls_back_and_regenerates(env: Env) -> None:
    sid, a1, _ = two_turns(env)
    assert env.chat(sid, {"messages": [U1, a1, T1]}).status_code == 200
    assert len(env.get(sid)["records"]) == 2


def test_divergent_retry_rolls_back_and_continues(env: Env) -> None:
    sid, a1, _ = two_turns(env)
    assert env.chat(sid, {"messages": [U1, a1, T1_DIFF]}).status_code == 200
    records = env.get(sid)["records"]
    assert len(records) == 2
    assert records[-1]["request"]["messages"][-1] == T1_DIFF


def test_deep_rollback_is_400_and_changes_nothing(env: Env) -> None:
    sid, a1, a2 = two_turns(env)
    t2 = {"role": "tool", "content": "tool-result-2", "tool_call_id": "t1"}
    a3 = env.turn(sid, [U1, a1, T1, a2, t2])
    before = env.get(sid)
    resp = env.chat(sid, {"messages": [U1, a1, T1_DIFF]})
    assert resp.status_code == 400
    text = env.error_text(resp, "rollback_too_deep")
    if env.miles:
        assert text == ("rollback failed: discard_count=2 exceeds max_assistant_rollback_steps=1"
                        " (stored has 6 messages, request has 3 messages)")
    else:  # deliberate: our wording names the flag and where the request left the path
        assert "discard_count=2" in text and "--max-rollback" in text
    after = env.get(sid)
    assert after["records"] == before["records"]
    assert after["metadata"]["accumulated_token_ids"] == \
        before["metadata"]["accumulated_token_ids"]
    t3 = {"role": "tool", "content": "tool-result-3", "tool_call_id": "t2"}
    assert env.chat(sid, {"messages": [U1, a1, T1, a2, t2, a3, t3]}).status_code == 200


def test_first_turn_retry_rolls_back_to_empty(env: Env) -> None:
    sid = env.new()
    env.turn(sid, [U1])
    again = env.turn(sid, [U1])
    records = env.get(sid)["records"]
    assert len(records) == 1 and records[0]["request"]["messages"] == [U1]
    assert env.chat(sid, {"messages": [U1, again, T1]}).status_code == 200


def test_failed_first_turn_leaves_the_session_empty(env: Env) -> None:
    sid = env.new()
    failed = env.chat(sid, {"messages": [{"role": "user", "content": "hi\nFAULT http_500"}]})
    assert failed.status_code >= 400
    assert env.get(sid)["records"] == []
    other = {"role": "user", "content": "a completely different opening"}
    assert env.chat(sid, {"messages": [other]}).status_code == 200
    [record] = env.get(sid)["records"]
    assert record["request"]["messages"] == [other]


def test_resending_the_exact_history_generates_again(env: Env) -> None:
    sid = env.new()
    a1 = env.turn(sid, [U1])
    assert env.chat(sid, {"messages": [U1, a1]}).status_code == 200
    assert len(env.get(sid)["records"]) == 2


def test_few_shot_retry_anchors_on_the_generated_turn(env: Env) -> None:
    few_shot = [{"role": "user", "content": "Q-few-shot"},
                {"role": "assistant", "content": "A-few-shot"},
                {"role": "user", "content": "Q-real\nSAY real"}]
    sid = env.new()
    a1 = env.turn(sid, few_shot)
    env.turn(sid, [*few_shot, a1, T1])
    assert env.chat(sid, {"messages": [*few_shot, a1, T1_DIFF]}).status_code == 200
    records = env.get(sid)["records"]
    assert len(records) == 2
    assert records[-1]["request"]["messages"][-1] == T1_DIFF


def test_samples_after_a_rollback_are_one_sample(env: Env) -> None:
    sid, a1, _ = two_turns(env)
    assert env.chat(sid, {"messages": [U1, a1, T1]}).status_code == 200
    resp = httpx.post(f"{env.url}/sessions/{sid}/samples", json={})
    assert resp.status_code == 200
    decoded = decode_samples(resp.content)
    assert decoded.empty_reason is None
    [sample] = decoded.samples
    assert sample.response_length > 0 and len(sample.loss_mask) == sample.response_length
    assert sample.tokens.tolist() == env.get(sid)["metadata"]["accumulated_token_ids"]


def test_developer_message_after_a_rollback_is_served_as_system(env: Env) -> None:
    """The reference answers 400 (``developer`` is no role it appends) after it already
    rolled back; tito, in both modes, serves it as ``system`` (OpenAI's newer name for
    it; refusing it would end the rollout) and changes nothing before validating."""
    sid, a1, _ = two_turns(env)
    developer = {"role": "developer", "content": "another\nSAY ok"}
    resp = env.chat(sid, {"messages": [U1, a1, developer]})
    assert resp.status_code == 200, resp.text
    records = env.get(sid)["records"]
    assert len(records) == 2
    assert records[-1]["request"]["messages"][-1]["content"] == developer["content"]


# -- v2: the records of the active path ---------------------------------------------------------
@pytest.mark.slow
def test_v2_records_carry_the_active_paths_requests(qwen3_stack: tuple[Proc, Proc]) -> None:
    engine, _ = qwen3_stack
    gateway = start_gateway(engine.url, tokenizer_dir("qwen3"), "qwen3",
                            "--session-version", "v2", "--compat", "miles")
    try:
        env = Env(gateway.url, miles=True)
        sid = env.new()
        a1 = env.turn(sid, [U1])
        env.turn(sid, [U1, a1, T1])
        env.turn(sid, [U1, a1, T1_DIFF])  # a sibling branch: the active path ends here
        body = env.get(sid)
        requests = [r["request"]["messages"] for r in body["records"]]
        assert requests == [[U1], [U1, a1, T1_DIFF]]
        assert body["records"][0]["response"]["choices"][0]["message"]["content"] == \
            a1["content"]
        assert len(body["metadata"]["tree"]["nodes"]) == 3
    finally:
        gateway.stop()


# -- v2 rollback pins (always-branch serving) ---------------------------------------------------
@pytest.fixture(scope="module")
def v2_gateways(qwen3_stack: tuple[Proc, Proc]) -> Iterator[dict[str, Proc]]:
    engine, _ = qwen3_stack
    started: dict[str, Proc] = {}
    try:
        for mode in ("none", "miles"):
            started[mode] = start_gateway(engine.url, tokenizer_dir("qwen3"), "qwen3",
                                          "--session-version", "v2", "--compat", mode)
        yield started
    finally:
        for proc in started.values():
            proc.stop()


@pytest.fixture(params=["default", "miles"])
def env2(request: pytest.FixtureRequest, v2_gateways: dict[str, Proc]) -> Env:
    miles = request.param == "miles"
    return Env(v2_gateways["miles" if miles else "none"].url, miles=miles)


def samples_of(env: Env, sid: str) -> list[Any]:
    resp = httpx.post(f"{env.url}/sessions/{sid}/samples", json={})
    assert resp.status_code == 200, resp.text
    return decode_samples(resp.content).samples


def tree_of(env: Env, sid: str) -> dict[str, Any]:
    return dict(env.get(sid)["metadata"]["tree"])


@pytest.mark.parametrize("tool", [T1, T1_DIFF], ids=["pure_drop", "divergent"])
def test_v2_retry_regenerates_on_a_sibling(env2: Env, tool: dict[str, Any]) -> None:
    sid, a1, _ = two_turns(env2)
    assert env2.chat(sid, {"messages": [U1, a1, tool]}).status_code == 200
    records = env2.get(sid)["records"]
    assert len(records) == 2 and records[-1]["request"]["messages"][-1] == tool
    assert [n["parent"] for n in tree_of(env2, sid)["nodes"]] == [None, 0, 0]


def test_v2_deep_divergence_branches_and_keeps_both_lines(env2: Env) -> None:
    sid, a1, a2 = two_turns(env2)
    t2 = {"role": "tool", "content": "tool-result-2", "tool_call_id": "t1"}
    env2.turn(sid, [U1, a1, T1, a2, t2])
    assert env2.chat(sid, {"messages": [U1, a1, T1_DIFF]}).status_code == 200
    after = env2.get(sid)
    assert len(after["records"]) == 2
    tree = after["metadata"]["tree"]
    assert len(tree["nodes"]) == 4
    assert sorted(len(leaf["path_node_ids"]) for leaf in tree["leaves"]) == [2, 3]
    samples = samples_of(env2, sid)
    assert len(samples) == 2  # the deep abandoned line still trains
    assert all(seg["req_ts"] is not None for s in samples for seg in s.metadata["lifecycle"])


def test_v2_root_divergence_opens_a_new_line(env2: Env) -> None:
    """The reference opens a second root in the session's tree; tito, in both modes,
    opens a new agent context (a sub-agent) holding that root (docs/miles.md): the
    records view stays the main agent's, and both lines train."""
    sid = env2.new()
    env2.turn(sid, [U1])
    other = {"role": "user", "content": "a different opening"}
    assert env2.chat(sid, {"messages": [other]}).status_code == 200
    after = env2.get(sid)
    assert len(after["records"]) == 1
    roots = [n["parent"] for c in after["metadata"]["contexts"] for n in c["tree"]["nodes"]]
    assert roots == [None, None]
    assert len(samples_of(env2, sid)) == 2


def test_v2_failed_first_turn_then_another_first_request(env2: Env) -> None:
    sid = env2.new()
    failed = env2.chat(sid, {"messages": [{"role": "user", "content": "hi\nFAULT http_500"}]})
    assert failed.status_code >= 400
    assert env2.get(sid)["records"] == []
    other = {"role": "user", "content": "a completely different opening"}
    assert env2.chat(sid, {"messages": [other]}).status_code == 200
    [record] = env2.get(sid)["records"]
    assert record["request"]["messages"] == [other]


def test_v2_resending_the_exact_history_generates_again(env2: Env) -> None:
    sid = env2.new()
    a1 = env2.turn(sid, [U1])
    assert env2.chat(sid, {"messages": [U1, a1]}).status_code == 200
    assert len(env2.get(sid)["records"]) == 2


def test_v2_developer_message_after_a_branch_is_served_as_system(env2: Env) -> None:
    """The reference answers 400 here (after moving its view); tito serves ``developer``
    as ``system`` in both modes, as in v1 (docs/miles.md)."""
    sid, a1, _ = two_turns(env2)
    resp = env2.chat(sid, {"messages": [U1, a1, {"role": "developer",
                                                 "content": "another\nSAY ok"}]})
    assert resp.status_code == 200, resp.text
    assert len(env2.get(sid)["records"]) == 2


def test_v2_samples_after_a_retry_are_one_sample(env2: Env) -> None:
    sid, a1, _ = two_turns(env2)
    assert env2.chat(sid, {"messages": [U1, a1, T1]}).status_code == 200
    [sample] = samples_of(env2, sid)  # the superseded retry leaf is dropped
    assert sample.response_length > 0 and len(sample.loss_mask) == sample.response_length


def test_v2_few_shot_retry_anchors_on_the_generated_turn(env2: Env) -> None:
    few_shot = [{"role": "user", "content": "Q-few-shot"},
                {"role": "assistant", "content": "A-few-shot"},
                {"role": "user", "content": "Q-real\nSAY real"}]
    sid = env2.new()
    a1 = env2.turn(sid, few_shot)
    env2.turn(sid, [*few_shot, a1, T1])
    assert env2.chat(sid, {"messages": [*few_shot, a1, T1_DIFF]}).status_code == 200
    assert len(env2.get(sid)["records"]) == 2


def test_v2_extending_a_length_cut_node(env2: Env) -> None:
    sid = env2.new()
    first = env2.chat(sid, {"messages": [U1], "max_tokens": 1})
    assert first.status_code == 200 and first.json()["choices"][0]["finish_reason"] == "length"
    a1 = first.json()["choices"][0]["message"]
    extend = env2.chat(sid, {"messages": [U1, a1, T1]})
    if env2.miles:
        assert extend.status_code == 409
        assert "truncated generation cannot be extended" in extend.json()["error"]
    else:  # deliberate: --after-length-cut keep (docs/miles.md)
        assert extend.status_code == 200
    fresh = {"role": "user", "content": "fresh"}
    assert env2.chat(sid, {"messages": [fresh]}).status_code == 200


def test_v2_a_carried_assistant_commits_under_the_first_node(env2: Env) -> None:
    sid = env2.new()
    a1 = env2.turn(sid, [U1])
    carried = {"role": "assistant", "content": "compacted summary of earlier work"}
    go = {"role": "tool", "content": "go", "tool_call_id": "t1"}
    assert env2.chat(sid, {"messages": [U1, a1, T1, carried, go]}).status_code == 200
    nodes = tree_of(env2, sid)["nodes"]
    assert len(nodes) == 2 and nodes[1]["parent"] == nodes[0]["id"]
