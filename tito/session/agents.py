"""Who a turn belongs to inside a session (design §5.5): the identity of an agent context
— main agent, sub-agent or side request — and the pure rules that tell them apart when no
header names the agent.

A *conversation* is known by its opening: its first message that is not a system message
(the task an agent was given). A request that names no agent goes to the context whose
conversation it continues (its opening is that context's); one that opens another
conversation is another agent. A *side request* — no tools, and a structured-output or
title-like request, on a session whose main agent has tools — is a context of its own that
is not trained on by default.

Pure: reads messages, changes nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tito.types.messages import Message

MAIN = "main"
"""The id (and agent id) of every session's first context: requests without agent
headers go there unless they open another conversation."""
ROLES = ("main", "subagent", "side")
SOURCES = ("default", "header", "inferred", "side")
"""How a context came to be: the session's first one, named by an agent header, inferred
from a request that opened another conversation, or a side request."""
MAX_CONTEXTS = 1024
"""Contexts per session (409 ``context_cap_reached`` past it)."""

_TITLE = re.compile(r"\btitle\b", re.IGNORECASE)
_SYSTEM_ROLES = ("system", "developer")
_SHORT = 3
"""A title request has at most this many messages besides system messages."""
_MIN_PROMPT = 8
"""The shortest tool-call argument matched against a sub-agent's task."""


@dataclass(frozen=True, slots=True)
class ContextInfo:
    """The identity of one agent context: fixed when it is created."""

    id: str
    agent_id: str
    role: str
    parent_agent_id: str | None = None
    parent_tool_call_id: str | None = None
    source: str = "header"
    derived_from: str | None = None
    """The context it was derived from (``X-Miles-Derived-From-Context-Id``, e.g. a
    compaction of it): lineage only, its tokens are its own."""

    def lineage(self) -> dict[str, Any]:
        """What each of its samples says of it (design §6.1)."""
        lineage = {"agent_id": self.agent_id, "context_id": self.id,
                   "parent_agent_id": self.parent_agent_id,
                   "parent_tool_call_id": self.parent_tool_call_id, "role": self.role}
        if self.derived_from is not None:  # only when named: older payloads unchanged
            lineage["derived_from_context_id"] = self.derived_from
        return lineage

    def to_json(self) -> dict[str, Any]:
        data = {"id": self.id, "agent_id": self.agent_id, "role": self.role,
                "parent_agent_id": self.parent_agent_id,
                "parent_tool_call_id": self.parent_tool_call_id, "source": self.source}
        if self.derived_from is not None:
            data["derived_from"] = self.derived_from
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ContextInfo:
        return cls(id=str(data["id"]), agent_id=str(data.get("agent_id") or data["id"]),
                   role=str(data.get("role") or "subagent"),
                   parent_agent_id=data.get("parent_agent_id"),
                   parent_tool_call_id=data.get("parent_tool_call_id"),
                   source=str(data.get("source") or "header"),
                   derived_from=data.get("derived_from"))


MAIN_INFO = ContextInfo(MAIN, MAIN, "main", source="default")


def opening(messages: list[Message]) -> Message | None:
    """The first message that is not a system message (the first message when all are);
    None for no messages."""
    for message in messages:
        if message.get("role") not in _SYSTEM_ROLES:
            return message
    return messages[0] if messages else None


def text_of(content: Any) -> str:
    """A message content's text (the text of its parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def title_like(messages: list[Message]) -> bool:
    """A short request whose system prompt or last user message asks for a title (the
    title a harness names a conversation with)."""
    if sum(1 for m in messages if m.get("role") not in _SYSTEM_ROLES) > _SHORT:
        return False
    users = [m for m in messages if m.get("role") == "user"]
    asks = [m for m in messages if m.get("role") in _SYSTEM_ROLES] + users[-1:]
    return any(_TITLE.search(text_of(m.get("content"))) for m in asks)


def spawning_call(parent: Message | None, task: Message | None) -> str | None:
    """The id of the tool call of ``parent`` (an assistant message) that handed out
    ``task`` (a sub-agent's opening): the call with a string argument the task's text
    contains (the longest such argument wins); None when none does."""
    if parent is None or task is None:
        return None
    text = text_of(task.get("content"))
    best: tuple[int, str | None] = (0, None)
    for call in parent.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        for value in _strings(arguments):
            if len(value) >= _MIN_PROMPT and len(value) > best[0] and value in text:
                best = (len(value), call.get("id"))
    return best[1]


def _strings(arguments: Any) -> list[str]:
    """The string values of a tool call's arguments (JSON text or an object)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return [arguments.strip()]
    if isinstance(arguments, dict):
        return [v.strip() for v in arguments.values() if isinstance(v, str)]
    return []
