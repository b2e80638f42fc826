"""What a turn request says about its agent (design §5.5), read once per request on the
shared turn route (:func:`tito.server.adapter.serve_turn`): the agent headers.

Agent headers, in three families:

- ours: ``X-Tito-Agent-Id``, ``X-Tito-Context-Id``, ``X-Tito-Parent-Agent-Id``,
  ``X-Tito-Parent-Tool-Call-Id``;
- the reference framework's: ``X-Miles-Agent-Run-Id``, ``X-Miles-Context-Id``,
  ``X-Miles-Parent-Agent-Run-Id``, ``X-Miles-Parent-Tool-Call-Id``;
- Claude Code's: ``x-claude-code-agent-id`` (sent by its sub-agents only; the main agent
  sends none) and ``x-claude-code-parent-agent-id``.

Ours and the reference framework's name the same things (both given: they must agree).
Claude Code's agent id next to one of them is a sub-agent *of* that agent (a harness that
names the Claude Code process, whose sub-agents add their own id). A value is 1 to 256
printable ASCII characters without spaces; anything else is 400 ``invalid_agent_header``
naming the header, before the session is touched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tito.types.errors import BadRequest
from tito.types.messages import AgentRef

FIELDS = ("agent_id", "context_id", "parent_agent_id", "parent_tool_call_id")
FAMILIES: dict[str, dict[str, str]] = {
    "tito": {"agent_id": "X-Tito-Agent-Id", "context_id": "X-Tito-Context-Id",
             "parent_agent_id": "X-Tito-Parent-Agent-Id",
             "parent_tool_call_id": "X-Tito-Parent-Tool-Call-Id"},
    "miles": {"agent_id": "X-Miles-Agent-Run-Id", "context_id": "X-Miles-Context-Id",
              "parent_agent_id": "X-Miles-Parent-Agent-Run-Id",
              "parent_tool_call_id": "X-Miles-Parent-Tool-Call-Id"},
    "claude": {"agent_id": "x-claude-code-agent-id",
               "parent_agent_id": "x-claude-code-parent-agent-id"},
}
_HEADERS: dict[bytes, tuple[str, str, str]] = {
    name.lower().encode(): (family, field, name)
    for family, names in FAMILIES.items() for field, name in names.items()}
"""Lower-case header name -> (family, field, display name)."""
_VALUE = re.compile(rb"[!-~]{1,256}")
MAX_VALUE = 256


def agent_ref(headers: Iterable[tuple[bytes, bytes]]) -> AgentRef | None:
    """The agent a request's headers name (an ASGI scope's raw ``headers``); None when it
    sends no agent header. BadRequest on a malformed value or a contradiction."""
    found: dict[str, dict[str, str]] | None = None
    for raw_name, raw_value in headers:
        if raw_name[:2] != b"x-":
            continue
        known = _HEADERS.get(raw_name.lower())
        if known is None:
            continue
        family, field, name = known
        if _VALUE.fullmatch(raw_value) is None:
            raise BadRequest(f"header {name} must be 1 to {MAX_VALUE} printable ASCII "
                             f"characters without spaces (got {len(raw_value)} bytes: "
                             f"{raw_value[:40]!r})", code="invalid_agent_header")
        found = {} if found is None else found
        found.setdefault(family, {})[field] = raw_value.decode("ascii")
    return None if found is None else _combined(found)


def _combined(found: dict[str, dict[str, str]]) -> AgentRef:
    tito, miles, claude = (found.get(f, {}) for f in ("tito", "miles", "claude"))
    for field in FIELDS:
        if field in tito and field in miles and tito[field] != miles[field]:
            raise BadRequest(f"headers {FAMILIES['tito'][field]} ({tito[field]!r}) and "
                             f"{FAMILIES['miles'][field]} ({miles[field]!r}) disagree",
                             code="invalid_agent_header")
    named = {**miles, **tito}
    family = "tito" if tito else "miles"
    sub = claude.get("agent_id")
    base = named.get("context_id") or named.get("agent_id")
    if sub is not None and base is not None and sub != base:
        # a sub-agent of the agent the harness named: its own id, that agent its parent
        named = {"agent_id": sub, "parent_agent_id": claude.get("parent_agent_id", base)}
        family = "claude"
    elif not named:
        named, family = claude, "claude"
    if "agent_id" not in named and "context_id" not in named:
        header = FAMILIES[family]["parent_agent_id"] if "parent_agent_id" in named else \
            FAMILIES[family].get("parent_tool_call_id", "")
        raise BadRequest(f"header {header} names a parent but no agent: send "
                         f"{FAMILIES[family]['agent_id']} too", code="invalid_agent_header")
    return AgentRef(agent_id=named.get("agent_id"), context_id=named.get("context_id"),
                    parent_agent_id=named.get("parent_agent_id"),
                    parent_tool_call_id=named.get("parent_tool_call_id"),
                    header=FAMILIES[family]["agent_id"])
