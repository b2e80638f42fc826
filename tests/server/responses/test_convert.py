"""Responses input items -> chat messages: a turn's reasoning folds into it wherever it
stands among the turn's items; namespaced calls are calls of the flat name; namespace
tools render under flat names."""

from __future__ import annotations

from typing import Any

import pytest

from tito.server.responses.convert import chat_messages, chat_tools, flat_name
from tito.server.responses.models import ITEM, ResponsesRequest
from tito.types.errors import BadRequest

R = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]}
EMPTY_R = {"type": "reasoning", "summary": []}
M = {"type": "message", "role": "assistant", "content": "text"}
C = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
C2 = {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"}
OUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
USER = {"role": "user", "content": "hi"}


def convert(*items: dict[str, Any]) -> list[dict[str, Any]]:
    return chat_messages([ITEM.validate_python(item) for item in items])


def turn(content: str | None, reasoning: str | None, *calls: dict[str, Any]
         ) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [{"id": c["call_id"], "type": "function", "function": {
            "name": c["name"], "arguments": c["arguments"]}} for c in calls]
    return message


@pytest.mark.parametrize("order", [[R, C, C2], [C, R, C2], [C, C2, R]])
def test_reasoning_folds_into_its_calls_wherever_it_stands(order: list[Any]) -> None:
    assert convert(USER, *order, OUT) == [USER, turn(None, "plan", C, C2),
                                          {"role": "tool", "tool_call_id": "c1",
                                           "content": "ok"}]


@pytest.mark.parametrize("order", [[R, M, C], [M, R, C], [M, C, R]])
def test_reasoning_folds_into_a_text_and_call_turn(order: list[Any]) -> None:
    assert convert(USER, *order) == [USER, turn("text", "plan", C)]


def test_empty_reasoning_after_a_call_is_the_calls_turn() -> None:
    assert convert(USER, C, EMPTY_R, OUT)[1] == turn(None, "", C)


def test_turn_boundaries() -> None:
    second = {**M, "content": "more"}
    # a reasoning item right before an assistant message that cannot join opens its turn
    assert convert(USER, M, R, second) == [USER, turn("text", None), turn("more", "plan")]
    assert convert(USER, C, R, second) == [USER, turn(None, None, C), turn("more", "plan")]
    # a second reasoning item starts a new turn
    assert convert(USER, R, C, R) == [USER, turn(None, "plan", C), turn(None, "plan")]
    # an assistant message after a message or a call starts a new turn
    assert convert(USER, M, second) == [USER, turn("text", None), turn("more", None)]


def test_a_namespaced_call_is_the_call_of_its_flat_name() -> None:
    call = {**C, "name": "read", "namespace": "mcp__files__"}
    assert convert(USER, call)[1]["tool_calls"][0]["function"]["name"] == "mcp__files__read"
    assert flat_name("agents", "spawn") == "agents__spawn"
    assert flat_name("mcp__files__", "read") == "mcp__files__read"
    assert flat_name("crm.", "get") == "crm.get"
    assert flat_name(None, "f") == "f"


def test_namespace_tools_render_under_flat_names() -> None:
    request = ResponsesRequest.model_validate({"input": "hi", "tools": [
        {"type": "function", "name": "f"},
        {"type": "namespace", "name": "agents", "description": "Sub-agents.",
         "tools": [{"type": "function", "name": "spawn", "description": "Start one.",
                    "parameters": {"type": "object"}},
                   {"type": "function", "name": "wait"}]},
        {"type": "web_search"}]})
    assert chat_tools(request.tools) == [
        {"type": "function", "function": {"name": "f"}},
        {"type": "function", "function": {"name": "agents__spawn",
                                          "description": "Sub-agents.\n\nStart one.",
                                          "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "agents__wait",
                                          "description": "Sub-agents."}}]
    clash = ResponsesRequest.model_validate({"input": "hi", "tools": [
        {"type": "function", "name": "agents__spawn"},
        {"type": "namespace", "name": "agents", "tools": [
            {"type": "function", "name": "spawn"}]}]})
    with pytest.raises(BadRequest, match="more than one tool is called agents__spawn"):
        chat_tools(clash.tools)
