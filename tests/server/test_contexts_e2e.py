"""Agent contexts end to end (design §5.5) with the real ``anthropic`` SDK on the real app:
a Claude-Code-style main agent calls its Agent tool, a sub-agent runs its own conversation
on the same session URL (with and without Claude Code's ``x-claude-code-agent-id``), then
the main agent goes on; a title request runs in parallel with the main agent's first turn.
Every model call is accounted for (the samples, or the side context the session metadata
lists), no sample has a mismatch, the lineage is right, and bad agent headers are 4xx that
leave the session as it was. v1 and v2."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import httpx2
import pytest
from helpers.fakes import ModelEngine
from helpers.inproc import asgi_client, new_session

from tito.config import ServerConfig
from tito.render.base import TemplateRenderer
from tito.samples import decode_samples
from tito.server.app import create_app
from tito.server.gateway import Gateway

SUB_ID = "a1b2c3d4e5f6a7b8c"
MAIN_SYSTEM = "You are the main agent. Delegate with the Agent tool."
SUB_SYSTEM = "You are a sub-agent. Report what you find."
MAIN_TOOLS = [
    {"name": "Agent", "description": "Run a sub-agent on a task", "input_schema": {
        "type": "object", "properties": {"description": {"type": "string"},
                                         "prompt": {"type": "string"}}}},
    {"name": "Read", "description": "Read a file", "input_schema": {
        "type": "object", "properties": {"path": {"type": "string"}}}},
]
SUB_TOOLS = MAIN_TOOLS[1:]
TASK_PROMPT = "Inspect parser.py for the off-by-one.\nCALL Read " + json.dumps(
    {"path": "parser.py"})
TASK = "Fix the failing parser test.\nCALL Agent " + json.dumps(
    {"description": "inspect", "prompt": TASK_PROMPT})
TITLE_SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}},
                "required": ["title"]}


def make(renderer: TemplateRenderer, qwen3_dir: Any, self_check: dict[str, Any],
         version: str, **config: Any) -> Gateway:
    cfg = ServerConfig(tokenizer=str(qwen3_dir), family="qwen3", engine="sglang",
                       engine_url="http://fake", session_version=version, **config)
    cfg.validate()
    return Gateway(cfg, renderer, ModelEngine(renderer), self_check=self_check)


def sdk(gateway: Gateway, sid: str) -> anthropic.AsyncAnthropic:
    """The real SDK on the in-process app (it brings its own HTTP client package)."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=create_app(gateway)),
                              base_url="http://127.0.0.1", timeout=10)
    return anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1/sessions/{sid}", api_key="x",
                                    max_retries=0, http_client=http)


def blocks(message: Any) -> list[dict[str, Any]]:
    return [block.model_dump(exclude_none=True) for block in message.content]


def tool_use(message: Any) -> Any:
    return next(b for b in message.content if b.type == "tool_use")


async def main_then_title(gateway: Gateway, client: anthropic.AsyncAnthropic
                          ) -> tuple[Any, Any]:
    """The main agent's first turn and a title request, both in flight at once."""
    engine: ModelEngine = gateway.engine  # type: ignore[assignment]
    engine.gate = asyncio.Event()
    main = asyncio.ensure_future(client.messages.create(
        model="claude-x", max_tokens=256, system=MAIN_SYSTEM, tools=MAIN_TOOLS,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": TASK}]))
    title = asyncio.ensure_future(client.messages.create(
        model="claude-x", max_tokens=64,
        system="Write a 3-7 word title for the user's request.",
        messages=[{"role": "user", "content": "Fix the failing parser test.\nSAY "
                                              '{"title": "Fix parser test"}'}],
        extra_body={"output_config": {"format": {"type": "json_schema",
                                                 "schema": TITLE_SCHEMA}}}))
    while len(engine.calls) < 2:  # both turns claimed and at the engine: no 409
        await asyncio.sleep(0.005)
    engine.gate.set()
    engine.gate = None
    return await main, await title


async def sub_agent(client: anthropic.AsyncAnthropic, prompt: str,
                    headers: dict[str, str]) -> Any:
    """The sub-agent's own conversation: a Read call, then its report (streamed)."""
    history: list[Any] = [{"role": "user", "content": prompt}]
    first = await client.messages.create(model="claude-x", max_tokens=256, system=SUB_SYSTEM,
                                         tools=SUB_TOOLS, messages=history,  # type: ignore[arg-type]
                                         extra_headers=headers)
    assert first.stop_reason == "tool_use" and tool_use(first).name == "Read"
    history += [{"role": "assistant", "content": blocks(first)},
                {"role": "user", "content": [{"type": "tool_result",
                                              "tool_use_id": tool_use(first).id,
                                              "content": "def parse(s): return s[1:]\n"
                                                         "SAY The slice drops the first char."}]}]
    async with client.messages.stream(model="claude-x", max_tokens=256,  # as Claude Code
                                      system=SUB_SYSTEM, tools=SUB_TOOLS,  # type: ignore[arg-type]
                                      messages=history, extra_headers=headers) as stream:
        report = await stream.get_final_message()
    assert report.stop_reason == "end_turn"
    return report


async def run_agents(gateway: Gateway, http: httpx.AsyncClient, sid: str,
                     headers: dict[str, str]) -> tuple[str, Any]:
    """Main turn 1 (Agent call) with a title in parallel, the sub-agent's two turns, main
    turn 2; the main agent's spawning call id and its last reply."""
    client = sdk(gateway, sid)
    first, title = await main_then_title(gateway, client)
    assert json.loads(title.content[-1].text) == {"title": "Fix parser test"}
    call = tool_use(first)
    assert first.stop_reason == "tool_use" and call.name == "Agent"
    report = await sub_agent(client, call.input["prompt"], headers)
    last = await client.messages.create(
        model="claude-x", max_tokens=256, system=MAIN_SYSTEM, tools=MAIN_TOOLS,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": TASK},
                  {"role": "assistant", "content": blocks(first)},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                "content": report.content[-1].text
                                                + "\nSAY Fixed the slice."}]}])
    assert last.stop_reason == "end_turn"
    return call.id, last


async def view(http: httpx.AsyncClient, sid: str) -> Any:
    body = (await http.get(f"/sessions/{sid}", params={"include_ids": "1"})).json()
    body["metadata"].pop("last_active")
    return body


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("headers", ["claude-code", "none"])
async def test_a_sub_agent_and_a_title_on_the_main_agents_session(
        qwen3_renderer: TemplateRenderer, qwen3_dir: Any, qwen3_self_check: dict[str, Any],
        version: str, headers: str) -> None:
    gateway = make(qwen3_renderer, qwen3_dir, qwen3_self_check, version)
    sent = {"x-claude-code-agent-id": SUB_ID} if headers == "claude-code" else {}
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        call_id, _ = await run_agents(gateway, http, sid, sent)
        resp = await http.post(f"/sessions/{sid}/samples", json={})
        assert resp.status_code == 200
        decoded = decode_samples(resp.content)

        engine: ModelEngine = gateway.engine  # type: ignore[assignment]
        assert len(engine.calls) == 5  # main 2, sub-agent 2, title 1
        sub_id = SUB_ID if sent else "agent-2"
        contexts = decoded.session_metadata["contexts"]
        assert [(c["context_id"], c["role"], c["num_turns"], c["source"]) for c in contexts] \
            == [("main", "main", 2, "default"), ("side-1", "side", 1, "side"),
                (sub_id, "subagent", 2, "header" if sent else "inferred")]
        assert decoded.session_metadata["side_requests"] == "drop"
        # every model call: in the samples (N of N of the trained ones), the title in the
        # side context the metadata lists
        trained = sum(len(s.metadata["lifecycle"]) for s in decoded.samples)
        assert trained == 4 == len(engine.calls) - 1
        assert [(s.metadata["agent_id"], s.metadata["role"], s.metadata["parent_agent_id"],
                 s.metadata["parent_tool_call_id"]) for s in decoded.samples] == [
            ("main", "main", None, None), (sub_id, "subagent", "main", call_id)]
        for sample in decoded.samples:
            assert sample.metadata["tito_session_mismatch"] == [], sample.metadata
            assert sample.status == "completed" and sample.metadata["num_turns"] == 2
            assert "tito_discarded_turns" not in sample.metadata  # nothing rolled back

        # bad agent input: 4xx in Anthropic's shape, the session unchanged
        before = await view(http, sid)
        client = sdk(gateway, sid)
        with pytest.raises(anthropic.BadRequestError) as err:
            await client.messages.create(model="m", max_tokens=8, messages=[
                {"role": "user", "content": "SAY hi"}],
                extra_headers={"X-Tito-Agent-Id": "helper", "X-Tito-Parent-Agent-Id": "ghost"})
        assert "'ghost'" in str(err.value.body)
        assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        with pytest.raises(anthropic.BadRequestError) as err:
            await client.messages.create(model="m", max_tokens=8, messages=[
                {"role": "user", "content": "SAY hi"}],
                extra_headers={"x-claude-code-agent-id": "x" * 300})
        assert "x-claude-code-agent-id" in str(err.value.body)
        assert await view(http, sid) == before
        assert len(engine.calls) == 5


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_side_requests_keep_returns_the_title(
        qwen3_renderer: TemplateRenderer, qwen3_dir: Any, qwen3_self_check: dict[str, Any],
        version: str) -> None:
    """``--side-requests keep``: every model call is in the samples (5 of 5)."""
    gateway = make(qwen3_renderer, qwen3_dir, qwen3_self_check, version,
                   side_requests="keep")
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        await run_agents(gateway, http, sid, {"x-claude-code-agent-id": SUB_ID})
        decoded = decode_samples((await http.post(f"/sessions/{sid}/samples")).content)
    assert [s.metadata["role"] for s in decoded.samples] == ["main", "side", "subagent"]
    assert sum(len(s.metadata["lifecycle"]) for s in decoded.samples) == 5
    assert decoded.session_metadata["side_requests"] == "keep"


async def test_v1_without_contexts_would_have_failed(
        qwen3_renderer: TemplateRenderer, qwen3_dir: Any,
        qwen3_self_check: dict[str, Any]) -> None:
    """The problem this solves, checked: the main agent's second turn extends its own
    first one bit for bit (the sub-agent did not roll it back)."""
    gateway = make(qwen3_renderer, qwen3_dir, qwen3_self_check, "v1")
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        await run_agents(gateway, http, sid, {})
        engine: ModelEngine = gateway.engine  # type: ignore[assignment]
        main_calls = [c for c in engine.calls
                      if MAIN_SYSTEM in qwen3_renderer.tokenizer.decode(c.input_ids)]
        first, last = main_calls[0], main_calls[-1]
        assert len(main_calls) == 2
        assert last.input_ids[: len(first.input_ids)] == first.input_ids
        main = (await http.get(f"/sessions/{sid}")).json()
        assert [r["rolled_back"] for r in main["records"]] == [0, 0]


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_count_tokens_counts_in_the_named_agents_context(
        qwen3_renderer: TemplateRenderer, qwen3_dir: Any, qwen3_self_check: dict[str, Any],
        version: str) -> None:
    """count_tokens with agent headers plans in that agent's context: a new agent opening
    with the main agent's task is counted as its own first turn (without the header, v1
    would take it as a rollback of the main agent) and leaves no context behind; the
    counts are the prompts its turns then send."""
    gateway = make(qwen3_renderer, qwen3_dir, qwen3_self_check, version)
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        await run_agents(gateway, http, sid, {"x-claude-code-agent-id": SUB_ID})
        client = sdk(gateway, sid)
        engine: ModelEngine = gateway.engine  # type: ignore[assignment]
        helper = {"x-claude-code-agent-id": "f" * 17}
        history: list[Any] = [{"role": "user", "content": TASK}]
        for turn in range(2):
            before = await view(http, sid)
            counted = await client.messages.count_tokens(
                model="claude-x", system=MAIN_SYSTEM, tools=MAIN_TOOLS, messages=history,  # type: ignore[arg-type]
                extra_headers=helper)
            assert await view(http, sid) == before  # nothing stored, no context left
            reply = await client.messages.create(
                model="claude-x", max_tokens=256, system=MAIN_SYSTEM, tools=MAIN_TOOLS,  # type: ignore[arg-type]
                messages=history, extra_headers=helper)
            assert len(engine.calls[-1].input_ids) == counted.input_tokens
            if turn == 0:
                history += [{"role": "assistant", "content": blocks(reply)},
                            {"role": "user", "content": [{
                                "type": "tool_result", "tool_use_id": tool_use(reply).id,
                                "content": "done\nSAY ok"}]}]
        if version == "v1":
            with pytest.raises(anthropic.BadRequestError, match="rollback_too_deep"):
                await client.messages.count_tokens(model="claude-x", system=MAIN_SYSTEM,
                                                   tools=MAIN_TOOLS, messages=history[:1])  # type: ignore[arg-type]
