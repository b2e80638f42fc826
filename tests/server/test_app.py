"""The real app in-process (httpx ASGI transport, the openai SDK), over a fake engine.

Routes, the OpenAI envelope for every error kind, 5xx logging with the cause chain,
409 on a concurrent turn, and "a failed request leaves the session exactly as it was".
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import openai
import pytest
from helpers.fakes import FakeEngine
from helpers.inproc import asgi_client, new_session, openai_for

from tito.samples import decode_samples
from tito.server.gateway import Gateway
from tito.types.errors import EngineError, EngineRejected, EngineTimeout

USER = [{"role": "user", "content": "hello"}]


async def chat(http: httpx.AsyncClient, sid: str, messages: list[dict[str, Any]],
               **body: Any) -> httpx.Response:
    return await http.post(f"/sessions/{sid}/v1/chat/completions",
                           json={"messages": messages, **body})


async def state(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    resp = await http.get(f"/sessions/{sid}", params={"include_ids": "1",
                                                      "include_messages": "1"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    for rec in body["records"]:  # timings differ between two reads; the trajectory not
        rec.pop("e2e_latency")
    body["metadata"].pop("last_active")
    return body


def assert_openai_error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]
    assert set(error) == {"message", "type", "code", "param"}
    return dict(error)


async def test_two_turns_with_the_openai_sdk(client: httpx.AsyncClient,
                                             engine: FakeEngine) -> None:
    engine.script("first answer", "second answer")
    sid = await new_session(client)
    sdk = openai_for(client, sid)
    messages: list[Any] = [{"role": "system", "content": "be brief"}, *USER]
    r1 = await sdk.chat.completions.create(model="m", messages=messages)
    assert r1.choices[0].message.content == "first answer"
    assert r1.choices[0].finish_reason == "stop"
    assert r1.usage is not None and r1.usage.prompt_tokens == len(engine.calls[0].input_ids)
    messages += [r1.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "again"}]
    r2 = await sdk.chat.completions.create(model="m", messages=messages)
    assert r2.choices[0].message.content == "second answer"
    first, second = engine.calls
    assert second.input_ids[: len(first.input_ids)] == first.input_ids  # TITO prefix
    resp = await client.post(f"/sessions/{sid}/samples", json={})
    assert resp.status_code == 200
    [sample] = decode_samples(resp.content).samples
    assert sample.tokens.tolist()[: len(second.input_ids)] == second.input_ids


async def test_stream_sends_role_call_finish_then_usage_and_done(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    """An engine without a stream of its own (FakeEngine) is streamed as one step."""
    engine.script({"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function", "id": "call_1", "function": {
                       "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]})
    sid = await new_session(client)
    sdk = openai_for(client, sid)
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    stream = await sdk.chat.completions.create(model="m", messages=USER, tools=tools,
                                               stream=True,
                                               stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert len(chunks) == 5
    assert chunks[0].choices[0].delta.role == "assistant"
    header, arguments = chunks[1].choices[0].delta, chunks[2].choices[0].delta
    assert header.tool_calls is not None and header.tool_calls[0].index == 0
    assert header.tool_calls[0].function is not None
    assert header.tool_calls[0].function.name == "get_weather"
    assert arguments.tool_calls is not None and arguments.tool_calls[0].function is not None
    assert arguments.tool_calls[0].function.arguments == '{"city": "Oslo"}'
    assert chunks[3].choices[0].finish_reason == "tool_calls"
    assert chunks[4].choices == [] and chunks[4].usage is not None


async def test_session_lifecycle_and_models(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    models = (await client.get(f"/sessions/{sid}/v1/models")).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tito-qwen3"
    assert (await client.delete(f"/sessions/{sid}")).status_code == 204
    # a late call is told its trajectory was collected (410), not that it never existed
    error = assert_openai_error(await client.get(f"/sessions/{sid}"), 410, "session_gone")
    assert "was deleted" in error["message"]
    assert_openai_error(await client.delete(f"/sessions/{sid}"), 410, "session_gone")
    resp = await chat(client, sid, USER)
    assert_openai_error(resp, 410, "session_gone")
    assert_openai_error(await client.get("/sessions/" + "e" * 32), 404, "session_not_found")


async def test_health_and_metrics(client: httpx.AsyncClient) -> None:
    health = (await client.get("/health")).json()
    assert health["status"] == "ok" and health["family"] == "qwen3"
    assert health["capabilities"]["append_only_verified"] is True
    sid = await new_session(client)
    await chat(client, sid, USER)
    await client.get("/sessions/" + "0" * 32)
    text = (await client.get("/metrics")).text
    assert "tito_turns_total 1" in text
    assert ('tito_errors_total{status="404",code="session_not_found",'
            'route="/sessions/{session_id}"} 1') in text


@pytest.mark.parametrize(("method", "path", "status", "code"), [
    ("GET", "/nowhere", 404, "unknown_route"),
    ("POST", "/health", 405, "method_not_allowed"),
    ("GET", "/sessions/{sid}/v1/nothing", 404, "unknown_route"),
    ("POST", "/sessions/{sid}/v1/chat/completions", 400, "invalid_json"),
    ("POST", "/sessions/0123/v1/chat/completions", 404, "session_not_found"),
])
async def test_routing_errors_use_the_openai_envelope(client: httpx.AsyncClient, method: str,
                                                      path: str, status: int,
                                                      code: str) -> None:
    sid = await new_session(client)
    resp = await client.request(method, path.format(sid=sid), content=b"{not json")
    assert_openai_error(resp, status, code)


@pytest.mark.parametrize(("body", "code"), [
    ({"messages": []}, "invalid_request"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "invalid_request"),
    ({"messages": USER, "n": 2}, "invalid_request"),
    ({"messages": USER, "temperature": -1}, "invalid_request"),
    ({"messages": USER, "chat_template_kwargs": "yes"}, "invalid_template_kwargs"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "invalid_request"),
    ([1, 2], "invalid_request"),
])
async def test_bad_input_is_400_and_leaves_the_session_as_it_was(
        client: httpx.AsyncClient, body: Any, code: str) -> None:
    sid = await new_session(client)
    assert (await chat(client, sid, USER)).status_code == 200
    before = await state(client, sid)
    resp = await client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
    assert_openai_error(resp, 400, code)
    assert await state(client, sid) == before


async def test_body_over_the_limit_is_413(make_gateway: Any) -> None:
    from helpers.inproc import asgi_client

    gateway = make_gateway(max_body_bytes=1000)
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        resp = await chat(http, sid, [{"role": "user", "content": "x" * 2000}])
        assert_openai_error(resp, 413, "payload_too_large")


@pytest.mark.parametrize(("error", "status", "code", "logged"), [
    (EngineError("engine transport error: Server disconnected"), 502, "engine_error", True),
    (EngineTimeout("engine timed out after 5s"), 504, "engine_timeout", True),
    (EngineRejected("prompt too long", engine_status=413), 413, "engine_rejected", False),
    (EngineRejected("bad sampling"), 400, "engine_rejected", False),
    (RuntimeError("a bug"), 500, "internal_error", True),
])
async def test_engine_failures_leave_the_session_unchanged_and_5xx_are_logged(
        client: httpx.AsyncClient, engine: FakeEngine, caplog: pytest.LogCaptureFixture,
        error: BaseException, status: int, code: str, logged: bool) -> None:
    sid = await new_session(client)
    assert (await chat(client, sid, USER)).status_code == 200
    before = await state(client, sid)
    try:
        raise error
    except BaseException as raised:  # give it a traceback, as a real failure has
        engine.script(raised)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="tito.server"):
        resp = await chat(client, sid, [*USER, {"role": "assistant", "content": "ok"},
                                        {"role": "user", "content": "more"}])
    assert_openai_error(resp, status, code)
    assert await state(client, sid) == before
    records = [r for r in caplog.records if r.name == "tito.server"]
    if not logged:
        assert records == []
        return
    [record] = records
    assert f"-> {status} {code}" in record.getMessage()
    assert record.exc_info is not None
    text = logging.Formatter().formatException(record.exc_info)
    assert type(error).__name__ in text and "Traceback" in text
    if status == 500:  # the wrapper names its cause: the bug's own traceback is shown
        assert "direct cause" in text and "a bug" in text
        assert "a bug" not in resp.json()["error"]["message"]


async def test_a_second_turn_while_one_runs_is_409_at_once(client: httpx.AsyncClient,
                                                           engine: FakeEngine) -> None:
    sid = await new_session(client)
    engine.gate = asyncio.Event()
    first = asyncio.create_task(chat(client, sid, USER))
    while not engine.calls:
        await asyncio.sleep(0.001)
    assert_openai_error(await chat(client, sid, USER), 409, "turn_in_progress")
    engine.gate.set()
    assert (await first).status_code == 200
    assert (await state(client, sid))["metadata"]["num_turns"] == 1


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_collect_during_a_turn_gives_what_is_committed(make_gateway: Any,
                                                            version: str) -> None:
    """As the reference server does: a collector that gave up on its agent (its tracer
    collects, then deletes) gets the committed trajectory, marked turn_in_progress."""
    from helpers.inproc import asgi_client

    gateway = make_gateway(session_version=version)
    engine: FakeEngine = gateway.engine
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        r0 = await chat(http, sid, USER)
        engine.gate = asyncio.Event()
        messages = [*USER, r0.json()["choices"][0]["message"],
                    {"role": "user", "content": "more"}]
        running = asyncio.create_task(chat(http, sid, messages))
        while len(engine.calls) < 2:
            await asyncio.sleep(0.001)
        resp = await http.post(f"/sessions/{sid}/samples", json={})
        assert resp.status_code == 200, resp.text
        decoded = decode_samples(resp.content)
        assert decoded.session_metadata["turn_in_progress"] is True
        [sample] = decoded.samples
        assert len(sample.metadata["lifecycle"]) == 1  # the committed turn only
        assert (await http.delete(f"/sessions/{sid}")).status_code == 204
        engine.gate.set()
        assert (await running).status_code == 200  # answered; nothing stored


async def test_deep_divergence_is_rollback_too_deep(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    messages: list[dict[str, Any]] = list(USER)
    for n in range(3):
        resp = await chat(client, sid, messages)
        messages += [resp.json()["choices"][0]["message"], {"role": "user", "content": f"{n}"}]
    before = await state(client, sid)
    resp = await chat(client, sid, [*USER, {"role": "assistant", "content": "other"},
                                    {"role": "user", "content": "x"}])
    assert_openai_error(resp, 400, "rollback_too_deep")
    assert await state(client, sid) == before


async def test_context_length_is_checked_before_the_engine(make_gateway: Any) -> None:
    from helpers.inproc import asgi_client

    gateway: Gateway = make_gateway(context=16)
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        resp = await chat(http, sid, [{"role": "user", "content": "word " * 40}])
        error = assert_openai_error(resp, 400, "context_length_exceeded")
        assert "the engine's context length (16)" in error["message"]
        assert gateway.engine.calls == []  # type: ignore[attr-defined]


async def test_samples_body_is_validated(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    for body in ({"max_seq_len": 0}, {"metadata": []}, {"nope": 1},
                 {"include_response": "no"}):
        assert_openai_error(await client.post(f"/sessions/{sid}/samples", json=body), 400,
                            "invalid_request")
    resp = await client.post(f"/sessions/{sid}/samples")
    assert resp.status_code == 200
    assert decode_samples(resp.content).empty_reason == "no_records"


async def test_sdk_raises_the_typed_errors(client: httpx.AsyncClient) -> None:
    sdk = openai_for(client, "f" * 32)
    with pytest.raises(openai.NotFoundError, match="session not found"):
        await sdk.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = {"k": value}
    return value


def nested_json(depth: int) -> str:
    """``depth`` levels of objects as JSON text (json.dumps itself stops near 1000)."""
    return '{"k":' * (depth - 1) + '"leaf"' + "}" * (depth - 1)


@pytest.mark.parametrize("template", [
    '{"messages": [{"role": "user", "content": "x", "extra": NEST}]}',
    '{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", '
    '"function": {"name": "f", "parameters": NEST}}]}',
    '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"a": NEST}}',
], ids=["message", "tools", "kwargs"])
async def test_deep_json_is_400_at_any_depth_over_the_limit(
        client: httpx.AsyncClient, template: str) -> None:
    sid = await new_session(client)
    assert (await chat(client, sid, USER)).status_code == 200
    before = await state(client, sid)
    for depth in (70, 300, 1000):
        body = template.replace("NEST", nested_json(depth))
        resp = await client.post(f"/sessions/{sid}/v1/chat/completions", content=body,
                                 headers={"content-type": "application/json"})
        error = assert_openai_error(resp, 400, "json_too_deep")
        assert "--max-json-depth" in error["message"]
    assert await state(client, sid) == before
    resp = await client.get(f"/sessions/{sid}", params={"include_messages": "1"})
    assert resp.status_code == 200
    # a long history whose stored prefix is deep enough but legal passes
    legal = [*USER, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "y", "extra": nested(40)}]
    assert (await chat(client, sid, legal)).status_code == 200


async def test_samples_metadata_depth_is_limited(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    resp = await client.post(f"/sessions/{sid}/samples",
                             content='{"metadata": ' + nested_json(300) + "}",
                             headers={"content-type": "application/json"})
    assert_openai_error(resp, 400, "json_too_deep")


@pytest.mark.parametrize("body", [
    {"messages": USER, "max_tokens": True},
    {"messages": USER, "stream": "yes"},
    {"messages": USER, "temperature": "0.5"},
    {"messages": USER, "n": 1.0},
    {"messages": [{"role": "user", "content": 5}]},
])
async def test_types_are_strict(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    sid = await new_session(client)
    resp = await client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
    assert_openai_error(resp, 400, "invalid_request")


async def test_integers_are_accepted_for_floats(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    resp = await chat(client, sid, USER, temperature=1, top_p=1, max_tokens=16)
    assert resp.status_code == 200, resp.text


async def test_health_reports_the_engine_down_as_503_degraded(gateway: Gateway,
                                                               engine: FakeEngine) -> None:
    from helpers.inproc import asgi_client

    engine.down = "connection refused"
    async with asgi_client(gateway) as http:
        resp = await http.get("/health")
        assert resp.status_code == 503
        body = resp.json()
        assert body["status"] == "degraded"
        assert body["engine"] == {"name": "fake", "url": None, "ok": False,
                                  "error": "connection refused"}
        engine.down = None
        assert await gateway.control.engine_state(refresh=True) is None
        resp = await http.get("/health")
        assert resp.status_code == 200 and resp.json()["engine"]["ok"] is True


async def test_max_rollback_lets_v1_rewind_further(make_gateway: Any) -> None:
    """``--max-rollback 2``: a request may abandon two generated turns (a compacting
    harness); three is still 400 with the limit named, and changes nothing."""
    async with asgi_client(make_gateway(max_rollback=2)) as http:
        sid = await new_session(http)
        messages: list[Any] = [{"role": "user", "content": "u0"}]
        for k in range(3):
            resp = await chat(http, sid, messages)
            messages += [resp.json()["choices"][0]["message"],
                         {"role": "user", "content": f"u{k + 1}"}]
        before = await state(http, sid)
        # the same conversation (its opening message), gone elsewhere at its first reply
        deep = await chat(http, sid, [messages[0], {"role": "user", "content": "elsewhere"}])
        assert_openai_error(deep, 400, "rollback_too_deep")
        assert "limit of 2" in deep.json()["error"]["message"]
        assert "--max-rollback" in deep.json()["error"]["message"]
        assert await state(http, sid) == before
        ok = await chat(http, sid, [*messages[:2], {"role": "user", "content": "u1 again"}])
        assert ok.status_code == 200, ok.text
        view = (await http.get(f"/sessions/{sid}")).json()
        assert view["metadata"]["num_turns"] == 2
        assert view["records"][-1]["rolled_back"] == 2
