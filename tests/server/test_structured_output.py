"""Structured output on every API (the real SDKs against real ``tito serve`` +
``tito mock-engine`` processes): Chat ``response_format``, Responses ``text.format`` and
Anthropic ``output_config`` (tests/server/anthropic/test_claude_code.py) reach the engine
as one JSON schema (SGLang ``sampling_params.json_schema``); an engine that cannot enforce
it runs the turn and notes it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from helpers.inproc import asgi_client, new_session, openai_for
from helpers.support import engine_log
from helpers.support import new_session as new_process_session

from tito.samples import decode_samples
from tito.server.gateway import Gateway
from tito.server.unsupported import NOTE_STRUCTURED_OUTPUT

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}},
          "required": ["answer"]}


def chat(url: str, sid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x", max_retries=0)


def sent_schema(engine_url: str, sid: str) -> Any:
    (entry,) = engine_log(engine_url, sid)
    schema = entry["sampling_params"].get("json_schema")
    return None if schema is None else json.loads(schema)


@pytest.mark.parametrize(("response_format", "expected"), [
    ({"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA,
                                             "strict": True}}, SCHEMA),
    ({"type": "json_object"}, {"type": "object"}),
    ({"type": "json_schema", "json_schema": {"name": "anything"}}, {"type": "object"}),
    ({"type": "text"}, None),
])
def test_chat_response_format_reaches_the_engine(stack: Any, response_format: Any,
                                                 expected: Any) -> None:
    engine, gateway = stack
    sid = new_process_session(gateway.url)
    reply = chat(gateway.url, sid).chat.completions.create(
        model="m", max_tokens=16, response_format=response_format,
        messages=[{"role": "user", "content": 'SAY {"answer": 5}'}])
    assert reply.choices[0].message.content == '{"answer": 5}'
    assert sent_schema(engine.url, sid) == expected


@pytest.mark.parametrize(("response_format", "expected"), [
    ({"type": "json_schema"}, "needs a json_schema object"),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema", "json_schema": {"schema": "not an object"}}, "schema"),
])
def test_a_bad_response_format_is_a_400(stack: Any, response_format: Any,
                                        expected: str) -> None:
    _, gateway = stack
    sid = new_process_session(gateway.url)
    with pytest.raises(openai.BadRequestError) as caught:
        chat(gateway.url, sid).chat.completions.create(
            model="m", max_tokens=16, response_format=response_format,
            messages=[{"role": "user", "content": "SAY hi"}])
    assert expected in str(caught.value)
    assert httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]["num_turns"] == 0


def test_responses_text_format_reaches_the_engine(stack: Any) -> None:
    engine, gateway = stack
    sid = new_process_session(gateway.url)
    response = chat(gateway.url, sid).responses.create(
        model="m", input='SAY {"answer": 5}', max_output_tokens=16,
        text={"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA,
                         "strict": True}})
    assert response.output_text == '{"answer": 5}'
    assert sent_schema(engine.url, sid) == SCHEMA
    sid = new_process_session(gateway.url)
    chat(gateway.url, sid).responses.create(model="m", input="SAY x", max_output_tokens=8,
                                            text={"format": {"type": "text"}})
    assert sent_schema(engine.url, sid) is None


def test_a_responses_schema_that_is_not_an_object_is_a_400(stack: Any) -> None:
    _, gateway = stack
    sid = new_process_session(gateway.url)
    with pytest.raises(openai.BadRequestError) as caught:
        chat(gateway.url, sid).responses.create(
            model="m", input="SAY x", max_output_tokens=8,
            text={"format": {"type": "json_schema", "name": "x", "schema": "nope"}})
    assert "text.format.schema must be an object" in str(caught.value)


# -- an engine without a grammar backend -----------------------------------------------------
async def notes_of(http: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    resp = await http.post(f"/sessions/{sid}/samples", json={})
    (sample,) = decode_samples(resp.content).samples
    return list(sample.metadata.get("tito_turn_notes", []))


async def test_an_engine_that_cannot_enforce_the_schema_notes_the_turn(
        gateway: Gateway) -> None:
    """An engine without ``enforces_json_schema`` (the embedded one, this fake) runs the
    turn unconstrained; the turn says so in the samples' ``tito_turn_notes``."""
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        sdk = openai_for(http, sid)
        await sdk.chat.completions.create(model="m", max_tokens=8,
                                          messages=[{"role": "user", "content": "hi"}])
        await sdk.chat.completions.create(
            model="m", max_tokens=8, response_format={"type": "json_object"},
            messages=[{"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "ok"},
                      {"role": "user", "content": "again"}])
        assert await notes_of(http, sid) == [{"turn": 1, NOTE_STRUCTURED_OUTPUT: "not_enforced"}]
        sid = await new_session(http)
        resp = await http.post(f"/sessions/{sid}/v1/messages", json={
            "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "title?"}],
            "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}})
        assert resp.status_code == 200, resp.text
        assert await notes_of(http, sid) == [{"turn": 0, NOTE_STRUCTURED_OUTPUT: "not_enforced"}]
    assert gateway.engine.calls[-1].params.json_schema == json.dumps(SCHEMA)  # type: ignore[attr-defined]
