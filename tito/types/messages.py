"""Chat-level value types shared by the API layer, sessions, renderers and parsers.

Messages stay plain dicts in OpenAI's shape (``role``, ``content``, ``tool_calls``,
``reasoning_content`` ...) exactly as the client sent them: replay matching compares what
the client really sends (design §5.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Message = dict[str, Any]
"""One chat message in OpenAI's shape, as sent by the client or written by the gateway."""


@dataclass(slots=True)
class TurnRequest:
    """What a session needs from a chat request, whatever API it came through."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] | None = None
    stored_prefix: list[Message] | None = None
    """The session's messages (a copy taken when the request arrived) that ``messages``
    was checked to start with, equal message for message: while they are still the
    session's messages, its planning need not compare them again."""
    notes: dict[str, Any] | None = None
    """What the API layer did to the request that a trainer should know (tools left out,
    images replaced, a constraint not applied...): kept in the turn's record
    (``request.notes``) and listed in the samples' metadata (``tito_turn_notes``). JSON
    values only."""


@dataclass(slots=True)
class ParsedCompletion:
    """An assistant message in OpenAI shape, parsed from output ids (design §4.5)."""

    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    """The API finish reason: ``stop``, ``tool_calls``, ``length`` or ``abort``."""

    def to_message(self) -> Message:
        message: Message = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


class Parser(Protocol):
    """Completion ids -> assistant message, per model family (``tito/parse/``)."""

    def parse(self, output_ids: Sequence[int], engine_finish: str) -> ParsedCompletion: ...
