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


@dataclass(frozen=True, slots=True)
class AgentRef:
    """The agent a request says it comes from (its agent headers, design §5.5): the
    session routes it to that agent's context instead of inferring one."""

    agent_id: str | None = None
    context_id: str | None = None
    """One agent's context when it has several (the reference framework's context id);
    None: the agent's own."""
    parent_agent_id: str | None = None
    parent_tool_call_id: str | None = None
    header: str = ""
    """The header the agent id came from (for error messages)."""
    derived_from: str | None = None
    """The context this one was derived from (e.g. a compaction of it): lineage only."""

    @property
    def key(self) -> str | None:
        """The context it names: its context id, else its agent id."""
        return self.context_id or self.agent_id


@dataclass(frozen=True, slots=True)
class TurnLinks:
    """How a turn relates to earlier generations of its context (the reference framework's
    ``X-Miles-Previous-Response-Id``, ``X-Miles-Retry-Of``, ``X-Miles-Supersedes``): each
    names a generation id (the ``X-Miles-Generation-Id`` of its reply)."""

    previous_response_id: str | None = None
    """The generation the request continues (v2: the node it attaches under)."""
    retry_of: str | None = None
    """The generation this turn samples again."""
    supersedes: str | None = None
    """The generation this turn replaces for training."""

    def to_json(self) -> dict[str, str]:
        return {name: value for name, value in (
            ("previous_response_id", self.previous_response_id), ("retry_of", self.retry_of),
            ("supersedes", self.supersedes)) if value is not None}


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
    agent: AgentRef | None = None
    """The agent the request's headers name (None: no agent header; the session infers
    the context)."""
    structured: bool = False
    """The request asks for structured output (a JSON schema or JSON object response
    format): with no tools, on a session whose main agent has tools, a side request."""
    context: str | None = None
    """The agent context that serves the request: set by the session when it claims the
    turn (:meth:`tito.session.Session.begin`)."""
    links: TurnLinks | None = None
    """The generation links its headers name (None: none)."""
    settings: dict[str, Any] | None = None
    """The request's explicit sampling settings (``temperature``, ``max_tokens``...):
    kept in the turn's record (``request.settings``). JSON values only."""


@dataclass(slots=True)
class ParsedCompletion:
    """An assistant message in OpenAI shape, parsed from output ids (design §4.5)."""

    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    """The API finish reason: ``stop``, ``tool_calls``, ``length`` or ``abort``."""
    decoded: tuple[Sequence[int], int, str] | None = field(default=None, repr=False,
                                                           compare=False)
    """(the ids, their count, their text) the parser decoded, when it keeps them: a
    later count over the same ids (reasoning tokens) reads the text instead of decoding
    again. Not part of the message."""

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
