"""Turning completion ids back into an assistant message (design §4.5)."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from tito.types.messages import ParsedCompletion

__all__ = ["api_finish_reason", "call_arguments", "make_call", "new_call_id",
           "stable_call_ids"]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def stable_call_ids(parsed: ParsedCompletion, key: str) -> ParsedCompletion:
    """``parsed`` with tool-call ids derived from ``key`` (the response id) and each call's
    position: a completion parsed while it streams and parsed whole gives its calls the
    same ids, so a call can be sent as soon as it is complete."""
    for i, call in enumerate(parsed.tool_calls):
        call["id"] = "call_" + hashlib.sha256(f"{key}/{i}".encode()).hexdigest()[:24]
    return parsed


def make_call(name: str, arguments: dict[str, Any], call_id: str | None = None
              ) -> dict[str, Any]:
    """An OpenAI tool call; ``arguments`` serialized as a JSON string."""
    return {"id": call_id or new_call_id(), "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def call_arguments(value: Any) -> dict[str, Any] | None:
    """Tool-call arguments as an object (given as one or as a JSON string), else None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def api_finish_reason(engine_finish: str, has_tool_calls: bool) -> str:
    """``tool_calls`` only when calls were parsed and the generation stopped normally."""
    if engine_finish == "length":
        return "length"
    if engine_finish == "abort":
        return "abort"
    return "tool_calls" if has_tool_calls else "stop"
