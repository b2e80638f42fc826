"""The tools a harness such as Codex declares on /v1/responses: ``namespace`` tools
(groups of function tools: MCP servers, sub-agents) are rendered under flat names and
their calls come back with the namespace and the name apart; hosted tools (``web_search``,
``file_search``, ``mcp`` ...) are left out of the render, noted in the turn and warned
about once per session, or refused under ``--hosted-tools error``. Real ``tito serve`` +
``tito mock-engine`` and the real ``openai`` SDK, or the app in-process."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers.inproc import asgi_client, openai_for
from helpers.inproc import new_session as new_inproc_session
from helpers.support import engine_log, new_session

from tito.samples import decode_samples
from tito.server.gateway import Gateway
from tito.types.tokenizer import load_tokenizer

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
           "strict": False}
READ = {"type": "function", "name": "read", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        "strict": False}
SPAWN = {"type": "function", "name": "spawn_agent", "description": "Start a sub-agent.",
         "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
         "strict": False, "defer_loading": True}
NAMESPACES = [
    {"type": "namespace", "name": "mcp__files__", "description": "Tools of the files server.",
     "tools": [READ]},
    {"type": "namespace", "name": "agents", "description": "", "tools": [SPAWN]},
]
HOSTED = [
    {"type": "web_search"},
    {"type": "web_search_preview_2025_03_11"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.example/sse",
     "require_approval": "never"},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "image_generation"},
    {"type": "local_shell"},
    {"type": "computer_use_preview", "display_width": 1024, "display_height": 768,
     "environment": "linux"},
]
HOSTED_NAMES = ["web_search", "web_search_preview_2025_03_11", "file_search",
                "mcp:deepwiki", "code_interpreter", "image_generation", "local_shell",
                "computer_use_preview"]
CALLS = 'CALL mcp__files__read {"path": "a.txt"}\nCALL agents__spawn_agent {"task": "t"}'


def client_for(url: str, sid: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x",
                              max_retries=0)


def prompt_text(qwen3_dir: Path, entry: dict[str, Any]) -> str:
    return load_tokenizer(qwen3_dir).decode(entry["input_ids"])


@pytest.mark.parametrize("stream", [False, True])
async def test_namespace_tools_are_called_by_their_flat_names(
        stack: Any, qwen3_dir: Path, stream: bool) -> None:
    engine, gateway = stack
    sid = new_session(gateway.url)
    client = client_for(gateway.url, sid)
    first_input: list[Any] = [{"role": "user", "content": CALLS}]
    tools: Any = [WEATHER, *NAMESPACES]
    if stream:
        async with client.responses.stream(model="m", input=first_input, tools=tools) as events:
            first = await events.get_final_response()
    else:
        first = await client.responses.create(model="m", input=first_input, tools=tools)
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.namespace, c.name) for c in calls] == [("mcp__files__", "read"),
                                                       ("agents", "spawn_agent")]
    assert json.loads(calls[0].arguments) == {"path": "a.txt"}
    assert [t.type for t in first.tools] == ["function", "namespace", "namespace"]
    (entry,) = engine_log(engine.url, sid)
    prompt = prompt_text(qwen3_dir, entry)
    for name in ("get_weather", "mcp__files__read", "agents__spawn_agent",
                 "Tools of the files server.\\n\\nRead a file."):
        assert name in prompt
    # Codex echoes the calls with their namespace: the session's own message, extended
    echoed = [item.model_dump(exclude_none=True) for item in first.output]
    second = await client.responses.create(model="m", tools=tools, input=[
        *first_input, *echoed,
        *({"type": "function_call_output", "call_id": c.call_id, "output": "SAY done"}
          for c in calls)])
    assert second.output_text == "done"
    state = httpx.get(f"{gateway.url}/sessions/{sid}",
                      params={"include_messages": "true"}).json()
    assert [r["rolled_back"] for r in state["records"]] == [0, 0]
    stored = state["messages"][1]["tool_calls"]
    assert [c["function"]["name"] for c in stored] == ["mcp__files__read",
                                                       "agents__spawn_agent"]


async def test_hosted_tools_are_left_out_and_noted(stack: Any) -> None:
    engine, gateway = stack
    with_hosted, without = new_session(gateway.url), new_session(gateway.url)
    text = 'CALL get_weather {"city": "Oslo"}'
    reply = await client_for(gateway.url, with_hosted).responses.create(
        model="m", input=text, tools=[WEATHER, *HOSTED])  # type: ignore[list-item]
    await client_for(gateway.url, without).responses.create(
        model="m", input=text, tools=[WEATHER])  # type: ignore[list-item]
    assert [t.type for t in reply.tools][1:] == [t["type"] for t in HOSTED]  # echoed as sent
    (a,), (b,) = engine_log(engine.url, with_hosted), engine_log(engine.url, without)
    assert a["input_ids"] == b["input_ids"]  # the same render: hosted tools left out
    resp = httpx.post(f"{gateway.url}/sessions/{with_hosted}/samples", json={})
    (sample,) = decode_samples(resp.content).samples
    assert sample.metadata["tito_turn_notes"] == [
        {"turn": 0, "hosted_tools_left_out": HOSTED_NAMES}]
    record = httpx.get(f"{gateway.url}/sessions/{with_hosted}").json()["records"][0]
    assert record["notes"] == {"hosted_tools_left_out": HOSTED_NAMES}


async def test_hosted_tools_warn_once_per_session_and_tool(
        gateway: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tito.server")
    async with asgi_client(gateway) as http:
        sid = await new_inproc_session(http)
        client = openai_for(http, sid)
        history: list[Any] = []
        for tools in ([{"type": "web_search"}], [{"type": "web_search"}],
                      [{"type": "web_search"}, {"type": "image_generation"}]):
            history.append({"role": "user", "content": "hi"})
            reply = await client.responses.create(model="m", input=history,
                                                  tools=tools)  # type: ignore[arg-type]
            history += [item.model_dump(exclude_none=True) for item in reply.output]
        other = openai_for(http, await new_inproc_session(http))
        await other.responses.create(model="m", input="hi",
                                     tools=[{"type": "web_search"}])  # type: ignore[list-item]
    warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warned) == 3, warned
    assert sid in warned[0] and "web_search" in warned[0]
    assert "image_generation" in warned[1] and "web_search" not in warned[1]
    assert sid not in warned[2]


async def test_hosted_tools_error_policy_refuses_them(make_gateway: Any) -> None:
    gateway: Gateway = make_gateway(hosted_tools="error")
    async with asgi_client(gateway) as http:
        sid = await new_inproc_session(http)
        client = openai_for(http, sid)
        first = await client.responses.create(model="m", input="hi",  # type: ignore[list-item]
                                              tools=[WEATHER, *NAMESPACES])
        before = (await http.get(f"/sessions/{sid}")).json()
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="m", input="again", tools=[  # type: ignore[list-item]
                WEATHER, *NAMESPACES, {"type": "web_search"}], previous_response_id=first.id)
        assert caught.value.code == "unsupported_tool"
        assert "web_search" in str(caught.value) and "--hosted-tools" in str(caught.value)
        after = (await http.get(f"/sessions/{sid}")).json()
        assert after["records"] == before["records"]
        # namespace tools are not hosted: they still run
        await client.responses.create(model="m", input="again", tools=[WEATHER, *NAMESPACES],  # type: ignore[list-item]
                                      previous_response_id=first.id)


async def test_a_codex_shaped_request_runs(stack: Any) -> None:
    """A request shaped as Codex sends it: instructions, a developer message, function,
    namespace and hosted tools, reasoning effort and summary, streaming, and fields the
    gateway ignores (``include``, ``prompt_cache_key``, ``text.verbosity``)."""
    _, gateway = stack
    sid = new_session(gateway.url)
    body = {
        "model": "gpt-5-codex", "instructions": "You are Codex.", "stream": True,
        "input": [{"type": "message", "role": "developer",
                   "content": [{"type": "input_text", "text": "<permissions/>"}]},
                  {"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": CALLS}]}],
        "tools": [WEATHER, *NAMESPACES, {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto", "parallel_tool_calls": False, "store": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1",
        "text": {"verbosity": "medium"},
    }
    done: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{gateway.url}/sessions/{sid}/v1/responses", json=body,
                      timeout=30) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["type"] == "response.output_item.done":
                    done.append(event["item"])
    assert [(i["type"], i.get("namespace"), i.get("name")) for i in done] == [
        ("reasoning", None, None), ("function_call", "mcp__files__", "read"),
        ("function_call", "agents", "spawn_agent")]


async def test_images_become_markers_under_the_placeholder_policy(make_gateway: Any) -> None:
    """Codex's ``view_image``: the function call's output is a list with an
    ``input_image``; under ``--images placeholder`` it renders as the marker, noted."""
    gateway: Gateway = make_gateway(images="placeholder")
    image = {"type": "input_image", "image_url": "data:image/png;base64,AA==",
             "detail": "high"}
    history: Any = [
        {"role": "user", "content": [{"type": "input_text", "text": "Look at a.png"}]},
        {"type": "function_call", "call_id": "call_1", "name": "view_image",
         "arguments": '{"path": "a.png"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": [image]},
        {"role": "user", "content": [{"type": "input_text", "text": "and "}, image]}]
    async with asgi_client(gateway) as http:
        sid = await new_inproc_session(http)
        await openai_for(http, sid).responses.create(model="m", input=history)
        state = (await http.get(f"/sessions/{sid}",
                                params={"include_messages": "true"})).json()
        samples = decode_samples((await http.post(f"/sessions/{sid}/samples")).content)
    assert state["messages"][2] == {"role": "tool", "tool_call_id": "call_1",
                                    "content": "[image]"}
    assert state["messages"][3] == {"role": "user", "content": "and [image]"}
    assert samples.samples[0].metadata["tito_turn_notes"] == [{"turn": 0,
                                                               "images_replaced": 2}]
    engine = gateway.engine
    assert "[image]" in gateway.renderer.tokenizer.decode(engine.calls[0].input_ids)  # type: ignore[attr-defined]
