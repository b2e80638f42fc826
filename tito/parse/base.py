"""Turning completion ids back into an assistant message (DESIGN 4.5)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class ParsedCompletion:
    """An assistant message in OpenAI shape, parsed from output ids."""

    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"

    def to_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def api_finish_reason(engine_finish: str, has_tool_calls: bool) -> str:
    """``tool_calls`` only when calls were parsed and the generation stopped normally."""
    if engine_finish == "length":
        return "length"
    if engine_finish == "abort":
        return "abort"
    return "tool_calls" if has_tool_calls else "stop"


class Parser(Protocol):
    def parse(self, output_ids: Sequence[int], engine_finish: str) -> ParsedCompletion: ...
