"""What Claude Code sends beyond plain tool use, through the real ``anthropic`` SDK against
real ``tito serve`` + ``tito mock-engine`` processes: tool search (deferred tools made
visible by ``tool_reference`` blocks), Anthropic's hosted tools, structured output
(``output_config`` / ``output_format``) and images (in tool results and user messages)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from helpers.inproc import asgi_client
from helpers.inproc import new_session as inproc_session
from helpers.scripted_claude import blocks, claude
from helpers.support import Proc, assert_tito_chain, engine_log, new_session, start_gateway

from tito.samples import decode_samples
from tito.server.gateway import Gateway
from tito.server.unsupported import IMAGE_MARKER
from tito.types.tokenizer import Tokenizer, load_tokenizer

SEARCH = {"name": "ToolSearch", "description": "Find deferred tools by keyword.",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}},
                           "required": ["query"]}}
WEATHER = {"name": "mcp__weather__get_weather", "description": "Weather of a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]},
           "defer_loading": True}
WEATHER_JSON = json.dumps({"type": "function", "function": {
    "name": WEATHER["name"], "description": WEATHER["description"],
    "parameters": WEATHER["input_schema"]}}, ensure_ascii=False)
"""The deferred tool as a ``tool_reference`` renders it (inside the tool result)."""
PLACEHOLDER = {"name": "DeferredToolPlaceholder", "description": "Deferred tools.",
               "input_schema": {"type": "object", "properties": {}}, "defer_loading": True}
PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                   "data": "iVBORw0KGgo="}}
TITLE_SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}},
                "required": ["title"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer(qwen3_dir: Path) -> Tokenizer:
    return load_tokenizer(qwen3_dir)


@pytest.fixture(scope="module")
def lenient(qwen3_stack: tuple[Proc, Proc], qwen3_dir: Path) -> Iterator[Proc]:
    """A second gateway on the same engine: images as markers, hosted tools refused."""
    engine, _ = qwen3_stack
    gateway = start_gateway(engine.url, qwen3_dir, "qwen3", "--images", "placeholder",
                            "--hosted-tools", "error")
    try:
        yield gateway
    finally:
        gateway.stop()


def prompt_text(tokenizer: Tokenizer, entry: dict[str, Any]) -> str:
    return tokenizer.decode(entry["input_ids"])


def turn_notes(url: str, sid: str) -> list[dict[str, Any]]:
    resp = httpx.post(f"{url}/sessions/{sid}/samples", json={})
    assert resp.status_code == 200, resp.text
    (sample,) = decode_samples(resp.content).samples
    return list(sample.metadata.get("tito_turn_notes", []))


def post(url: str, sid: str, **body: Any) -> httpx.Response:
    request = {"model": "m", "max_tokens": 32, **body}
    return httpx.post(f"{url}/sessions/{sid}/v1/messages", json=request)


# -- tool search -----------------------------------------------------------------------------
def test_a_tool_reference_renders_the_deferred_tool_inside_its_result(
        stack: Any, tokenizer: Tokenizer) -> None:
    """Claude Code's shape: a deferred placeholder tool, a system message inside
    ``messages``, the loaded tool appended to ``tools`` (deferred) with the result that
    references it, ``cache_control`` moving to the newest block."""
    engine, gateway = stack
    sid = new_session(gateway.url)
    client = claude(gateway.url, sid)
    tools: Any = [SEARCH, PLACEHOLDER]
    history: list[dict[str, Any]] = [
        {"role": "user", "content": 'Weather in Paris?\nCALL ToolSearch {"query": "weather"}'},
        {"role": "system", "content": "Deferred tools: mcp__weather__get_weather"}]
    first = client.messages.create(model="m", max_tokens=64, tools=tools, messages=history)  # type: ignore[arg-type]
    search = next(b for b in first.content if b.type == "tool_use")
    tools = [*tools, WEATHER]
    history += [{"role": "assistant", "content": blocks(first)},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": search.id, "content": [
                        {"type": "tool_reference", "tool_name": WEATHER["name"]}]},
                    {"type": "text", "text": f'Tool loaded.\nCALL {WEATHER["name"]} '
                     '{"city": "Paris"}', "cache_control": {"type": "ephemeral"}}]}]
    second = client.messages.create(model="m", max_tokens=64, tools=tools, messages=history)  # type: ignore[arg-type]
    call = next(b for b in second.content if b.type == "tool_use")
    assert call.name == WEATHER["name"] and call.input == {"city": "Paris"}
    history[-1]["content"][-1].pop("cache_control")
    history += [{"role": "assistant", "content": blocks(second)},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "sunny"},
                    {"type": "text", "text": "SAY Sunny in Paris."}]}]
    third = client.messages.create(model="m", max_tokens=64, tools=tools, messages=history)  # type: ignore[arg-type]
    assert third.content[-1].text.endswith("Sunny in Paris.")  # type: ignore[union-attr]

    log = engine_log(engine.url, sid)
    assert len(log) == 3
    assert_tito_chain(log)
    # deferred: not in the system prompt, visible from the tool result on
    tools_text = prompt_text(tokenizer, log[0]).split("<|im_end|>")[0]  # the system prompt
    assert SEARCH["name"] in tools_text and PLACEHOLDER["name"] not in tools_text
    assert WEATHER["name"] not in tools_text
    assert f"<tool_response>\n<tools>\n{WEATHER_JSON}\n</tools>\n</tool_response>" in \
        prompt_text(tokenizer, log[1])
    view = httpx.get(f"{gateway.url}/sessions/{sid}",
                     params={"include_messages": "true", "limit": 20}).json()
    assert view["metadata"]["num_turns"] == 3  # every resend matched what was stored
    tool_messages = [m for m in view["messages"] if m["role"] == "tool"]
    assert tool_messages[0]["content"] == f"<tools>\n{WEATHER_JSON}\n</tools>"


def test_references_next_to_text_group_into_one_tools_block(stack: Any,
                                                            tokenizer: Tokenizer) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    other = {**WEATHER, "name": "mcp__weather__forecast", "description": "Forecast."}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": 'CALL ToolSearch {"query": "weather"}'}]
    first = post(gateway.url, sid, tools=[SEARCH, WEATHER, other], messages=history).json()
    history += [{"role": "assistant", "content": first["content"]},
                {"role": "user", "content": [{"type": "tool_result",
                                              "tool_use_id": first["content"][-1]["id"],
                                              "content": [
                    {"type": "text", "text": "Found 2 tools"},
                    {"type": "tool_reference", "tool_name": WEATHER["name"]},
                    {"type": "tool_reference", "tool_name": other["name"]}]}]}]
    resp = post(gateway.url, sid, tools=[SEARCH, WEATHER, other], messages=history)
    assert resp.status_code == 200, resp.text
    other_json = json.dumps({"type": "function", "function": {
        "name": other["name"], "description": "Forecast.",
        "parameters": WEATHER["input_schema"]}})
    assert f"Found 2 tools\n<tools>\n{WEATHER_JSON}\n{other_json}\n</tools>" in \
        prompt_text(tokenizer, engine_log(engine.url, sid)[-1])


@pytest.mark.parametrize(("content", "expected"), [
    ([{"type": "tool_result", "tool_use_id": "toolu_1",
       "content": [{"type": "tool_reference", "tool_name": "mcp__nowhere"}]}],
     "'mcp__nowhere'"),
    ([{"type": "tool_reference", "tool_name": "ToolSearch"}],
     "a 'tool_reference' block belongs inside a tool_result"),
    ([{"type": "tool_result", "tool_use_id": "toolu_1",
       "content": [{"type": "tool_reference"}]}], "tool_name"),
])
def test_a_bad_tool_reference_is_a_400_naming_it(stack: Any, content: Any,
                                                  expected: str) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude(gateway.url, sid).messages.create(
            model="m", max_tokens=16, tools=[SEARCH, WEATHER],  # type: ignore[list-item]
            messages=[{"role": "user", "content": "SAY hi"},
                      {"role": "assistant", "content": [
                          {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch",
                           "input": {"query": "x"}}]},
                      {"role": "user", "content": content}])
    assert expected in caught.value.body["error"]["message"]  # type: ignore[index]
    assert httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]["num_turns"] == 0


# -- hosted tools ----------------------------------------------------------------------------
HOSTED = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
          {"type": "code_execution_20250825", "name": "code_execution"},
          {"type": "mcp_toolset", "mcp_server_name": "db"}]


def test_hosted_tools_are_left_out_and_noted(stack: Any, tokenizer: Tokenizer) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    reply = claude(gateway.url, sid).messages.create(
        model="m", max_tokens=16, tools=[SEARCH, *HOSTED],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "SAY Hi."}])
    assert reply.content[-1].text.endswith("Hi.")  # type: ignore[union-attr]
    text = prompt_text(tokenizer, engine_log(engine.url, sid)[0])
    assert SEARCH["name"] in text and "web_search" not in text and "code_execution" not in text
    assert turn_notes(gateway.url, sid) == [{"turn": 0, "hosted_tools_left_out": [
        "web_search_20250305", "code_execution_20250825", "mcp_toolset"]}]


def test_claude_code_s_web_search_side_request_runs_streamed(stack: Any,
                                                             tokenizer: Tokenizer) -> None:
    """Its only tool is hosted: the turn renders no tools at all."""
    engine, gateway = stack
    sid = new_session(gateway.url)
    with claude(gateway.url, sid).messages.stream(
            model="m", max_tokens=128000, tools=[HOSTED[0]], tool_choice={"type": "auto"},  # type: ignore[list-item]
            system=[{"type": "text", "text": "You run a web search for another model."}],
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "Perform a web search.\nSAY Nothing found."}]}],
            output_config={"effort": "medium"}) as events:
        reply = events.get_final_message()
    assert reply.content[-1].text.endswith("Nothing found.")  # type: ignore[union-attr]
    assert "<tools>" not in prompt_text(tokenizer, engine_log(engine.url, sid)[0])
    assert turn_notes(gateway.url, sid) == [{"turn": 0,
                                            "hosted_tools_left_out": ["web_search_20250305"]}]


def test_hosted_tools_are_refused_under_hosted_tools_error(lenient: Proc) -> None:
    sid = new_session(lenient.url)
    resp = post(lenient.url, sid, tools=[SEARCH, *HOSTED],
                messages=[{"role": "user", "content": "SAY Hi."}])
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "web_search_20250305" in error["message"] and "mcp_toolset" in error["message"]
    assert httpx.get(f"{lenient.url}/sessions/{sid}").json()["metadata"]["num_turns"] == 0


# -- structured output -----------------------------------------------------------------------
def test_output_config_json_schema_reaches_the_engine(stack: Any) -> None:
    """Claude Code's title request: no tools, a JSON schema in ``output_config``."""
    engine, gateway = stack
    sid = new_session(gateway.url)
    reply = claude(gateway.url, sid).messages.create(
        model="m", max_tokens=32, system="Write a title for the conversation.",
        messages=[{"role": "user", "content": 'SAY {"title": "Weather in Paris"}'}],
        output_config={"format": {"type": "json_schema", "schema": TITLE_SCHEMA}})
    assert json.loads(reply.content[-1].text) == {"title": "Weather in Paris"}  # type: ignore[union-attr]
    (entry,) = engine_log(engine.url, sid)
    assert json.loads(entry["sampling_params"]["json_schema"]) == TITLE_SCHEMA
    assert turn_notes(gateway.url, sid) == []  # the engine enforces it: nothing to note


def test_the_beta_output_format_field_reaches_the_engine(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    resp = post(gateway.url, sid, messages=[{"role": "user", "content": 'SAY {"title": "x"}'}],
                output_format={"type": "json_schema", "schema": TITLE_SCHEMA})
    assert resp.status_code == 200, resp.text
    (entry,) = engine_log(engine.url, sid)
    assert json.loads(entry["sampling_params"]["json_schema"]) == TITLE_SCHEMA


def test_without_a_schema_no_constraint_is_sent(stack: Any) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    assert post(gateway.url, sid, messages=[{"role": "user", "content": "SAY x"}],
                output_config={"effort": "low"}).status_code == 200
    (entry,) = engine_log(engine.url, sid)
    assert "json_schema" not in entry["sampling_params"]


@pytest.mark.parametrize(("body", "expected"), [
    ({"output_config": {"format": {"type": "xml"}}}, "output_config.format.type"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "schema"),
    ({"output_format": {"type": "json_schema", "schema": "not an object"}}, "schema"),
])
def test_a_bad_output_format_is_a_400(stack: Any, body: dict[str, Any], expected: str) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    resp = post(gateway.url, sid, messages=[{"role": "user", "content": "SAY x"}], **body)
    assert resp.status_code == 400, resp.text
    assert expected in resp.json()["error"]["message"]


# -- images ----------------------------------------------------------------------------------
def image_history(first: Any) -> list[dict[str, Any]]:
    call = next(b for b in first["content"] if b["type"] == "tool_use")
    return [{"role": "user", "content": 'CALL Read {"file_path": "shot.png"}'},
            {"role": "assistant", "content": first["content"]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call["id"], "content": [PNG]},
                {"type": "text", "text": "What do you see?"}, PNG,
                {"type": "text", "text": "SAY A screenshot."}]}]


READ = {"name": "Read", "input_schema": {"type": "object", "properties": {
    "file_path": {"type": "string"}}}}


def test_an_image_is_refused_by_default(stack: Any) -> None:
    _, gateway = stack
    sid = new_session(gateway.url)
    first = post(gateway.url, sid, tools=[READ], messages=[
        {"role": "user", "content": 'CALL Read {"file_path": "shot.png"}'}]).json()
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude(gateway.url, sid).messages.create(model="m", max_tokens=16, tools=[READ],  # type: ignore[list-item]
                                                 messages=image_history(first))  # type: ignore[arg-type]
    message = caught.value.body["error"]["message"]  # type: ignore[index]
    assert "messages.2.content.0.content.0 is an image" in message
    assert "--images placeholder" in message
    assert httpx.get(f"{gateway.url}/sessions/{sid}").json()["metadata"]["num_turns"] == 1


def test_images_become_markers_under_images_placeholder(
        lenient: Proc, qwen3_stack: tuple[Proc, Proc], tokenizer: Tokenizer) -> None:
    engine, _ = qwen3_stack
    sid = new_session(lenient.url)
    first = post(lenient.url, sid, tools=[READ], messages=[
        {"role": "user", "content": 'CALL Read {"file_path": "shot.png"}'}]).json()
    history = image_history(first)
    reply = claude(lenient.url, sid).messages.create(model="m", max_tokens=16, tools=[READ],  # type: ignore[list-item]
                                                     messages=history)  # type: ignore[arg-type]
    assert reply.content[-1].text.endswith("A screenshot.")  # type: ignore[union-attr]
    text = prompt_text(tokenizer, engine_log(engine.url, sid)[-1])
    assert f"<tool_response>\n{IMAGE_MARKER}\n</tool_response>" in text
    assert f"What do you see?\n{IMAGE_MARKER}\nSAY A screenshot." in text
    assert turn_notes(lenient.url, sid) == [{"turn": 1, "images_replaced": 2}]
    # the history with its images replays: the next turn extends the session
    history += [{"role": "assistant", "content": blocks(reply)},
                {"role": "user", "content": "SAY Done."}]
    assert post(lenient.url, sid, tools=[READ], messages=history).status_code == 200
    assert httpx.get(f"{lenient.url}/sessions/{sid}").json()["metadata"]["num_turns"] == 3
    assert turn_notes(lenient.url, sid)[-1] == {"turn": 2, "images_replaced": 2}


async def test_a_hosted_tool_is_logged_once_per_session(
        gateway: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    async with asgi_client(gateway) as http:
        sid = await inproc_session(http)
        body: dict[str, Any] = {"model": "m", "max_tokens": 8, "tools": [SEARCH, HOSTED[0]],
                                "messages": [{"role": "user", "content": "hi"}]}
        with caplog.at_level(logging.WARNING, logger="tito.server"):
            for _ in range(2):
                resp = await http.post(f"/sessions/{sid}/v1/messages", json=body)
                assert resp.status_code == 200, resp.text
                body["messages"] += [{"role": "assistant", "content": resp.json()["content"]},
                                     {"role": "user", "content": "again"}]
    warnings = [r.getMessage() for r in caplog.records if "web_search_20250305" in r.getMessage()]
    assert len(warnings) == 1 and sid in warnings[0]
