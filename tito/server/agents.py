"""What a turn request says about its agent (design §5.5), read once per request on the
shared turn route (:func:`tito.server.adapter.serve_turn`): the agent headers.

Agent headers, in three families:

- ours: ``X-Tito-Agent-Id``, ``X-Tito-Context-Id``, ``X-Tito-Parent-Agent-Id``,
  ``X-Tito-Parent-Tool-Call-Id``;
- the reference framework's: ``X-Miles-Agent-Run-Id``, ``X-Miles-Context-Id``,
  ``X-Miles-Parent-Agent-Run-Id``, ``X-Miles-Parent-Tool-Call-Id``;
- Claude Code's: ``x-claude-code-agent-id`` (sent by its sub-agents only; the main agent
  sends none) and ``x-claude-code-parent-agent-id``;
- Codex's: ``x-codex-window-id`` (``<thread id>:<window number>``: the thread is the agent,
  each window — a new one after every compaction — a context of it) and
  ``x-codex-parent-thread-id`` (a sub-agent's parent thread); its ``session-id`` header
  names the root thread.

Ours and the reference framework's also name the context a new one was derived from
(``X-Tito-Derived-From-Context-Id``, ``X-Miles-Derived-From-Context-Id``: e.g. a
compaction; lineage only). Generation links (:func:`turn_links`) name earlier generations:
``X-Miles-Previous-Response-Id`` (with an explicit agent header), ``X-Miles-Retry-Of`` and
``X-Miles-Supersedes`` (and ours, ``X-Tito-...``).

Ours and the reference framework's name the same things (both given: they must agree).
Claude Code's agent id, or a Codex thread with a parent, next to one of them is a
sub-agent *of* that agent (a harness that names the CLI process, whose sub-agents add
their own id); a Codex root thread next to one of them is that agent, each window a
context of it. A value is 1 to 256 printable ASCII characters without spaces; anything
else is 400 ``invalid_agent_header`` naming the header, before the session is touched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tito.types.errors import BadRequest
from tito.types.messages import AgentRef, TurnLinks

FIELDS = ("agent_id", "context_id", "parent_agent_id", "parent_tool_call_id", "derived_from")
FAMILIES: dict[str, dict[str, str]] = {
    "tito": {"agent_id": "X-Tito-Agent-Id", "context_id": "X-Tito-Context-Id",
             "parent_agent_id": "X-Tito-Parent-Agent-Id",
             "parent_tool_call_id": "X-Tito-Parent-Tool-Call-Id",
             "derived_from": "X-Tito-Derived-From-Context-Id"},
    "miles": {"agent_id": "X-Miles-Agent-Run-Id", "context_id": "X-Miles-Context-Id",
              "parent_agent_id": "X-Miles-Parent-Agent-Run-Id",
              "parent_tool_call_id": "X-Miles-Parent-Tool-Call-Id",
              "derived_from": "X-Miles-Derived-From-Context-Id"},
    "claude": {"agent_id": "x-claude-code-agent-id",
               "parent_agent_id": "x-claude-code-parent-agent-id"},
    "codex": {"context_id": "x-codex-window-id", "parent_agent_id": "x-codex-parent-thread-id",
              "root": "session-id"},
}
LINKS: dict[str, tuple[str, str]] = {
    "previous_response_id": ("X-Tito-Previous-Response-Id", "X-Miles-Previous-Response-Id"),
    "retry_of": ("X-Tito-Retry-Of", "X-Miles-Retry-Of"),
    "supersedes": ("X-Tito-Supersedes", "X-Miles-Supersedes"),
}
"""Generation links: field -> (our header, the reference framework's)."""
_HEADERS: dict[bytes, tuple[str, str, str]] = {
    name.lower().encode(): (family, field, name)
    for family, names in FAMILIES.items() for field, name in names.items()}
_HEADERS.update({name.lower().encode(): ("links", field, name)
                 for field, names in LINKS.items() for name in names})
"""Lower-case header name -> (family, field, display name)."""
_PREFIXES = (b"x-", b"se")
"""The first two bytes of every agent header name (a cheap filter on every request;
ASGI header names are lower case)."""
_VALUE = re.compile(rb"[!-~]{1,256}")
MAX_VALUE = 256


def agent_ref(headers: Iterable[tuple[bytes, bytes]]) -> AgentRef | None:
    """The agent a request's headers name (an ASGI scope's raw ``headers``); None when it
    sends no agent header. BadRequest on a malformed value or a contradiction."""
    return request_refs(headers)[0]


def request_refs(headers: Iterable[tuple[bytes, bytes]]
                 ) -> tuple[AgentRef | None, TurnLinks | None]:
    """The agent and the generation links a request's headers name (each None when it
    sends none); BadRequest on a malformed value, a contradiction, or a previous response
    without an explicit agent header (the reference framework's rule)."""
    found = _read(headers)
    links = found.pop("links", None)
    explicit = "tito" in found or "miles" in found
    agent = None if not found or (list(found) == ["codex"]
                                  and "context_id" not in found["codex"]) else _combined(found)
    if links is None:
        return agent, None
    if "previous_response_id" in links and (agent is None or not explicit):
        name = LINKS["previous_response_id"][1]
        raise BadRequest(f"header {name} needs an explicit agent context: send "
                         "X-Miles-Agent-Run-Id and X-Miles-Context-Id (or X-Tito-Agent-Id) "
                         "too", code="invalid_agent_header")
    return agent, TurnLinks(**links)


def _read(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, dict[str, str]]:
    """The known headers' values by family and field (empty: none)."""
    found: dict[str, dict[str, str]] = {}
    for raw_name, raw_value in headers:
        if raw_name[:2] not in _PREFIXES:
            continue
        known = _HEADERS.get(raw_name.lower())
        if known is None:
            continue
        family, field, name = known
        if _VALUE.fullmatch(raw_value) is None:
            if field == "root":
                continue  # a generic name: read only next to Codex's window id
            raise BadRequest(f"header {name} must be 1 to {MAX_VALUE} printable ASCII "
                             f"characters without spaces (got {len(raw_value)} bytes: "
                             f"{raw_value[:40]!r})", code="invalid_agent_header")
        found.setdefault(family, {})[field] = raw_value.decode("ascii")
    return found


def _combined(found: dict[str, dict[str, str]]) -> AgentRef:
    tito, miles, claude = (found.get(f, {}) for f in ("tito", "miles", "claude"))
    codex = _codex(found.get("codex", {}))
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
    elif codex and base is not None:
        named, family = _codex_under(codex, named, base), "codex"
    elif not named and codex:
        named, family = codex, "codex"
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
                    header=FAMILIES[family].get("agent_id") or FAMILIES[family]["context_id"],
                    derived_from=named.get("derived_from"))


def _codex(given: dict[str, str]) -> dict[str, str]:
    """Codex's headers as agent fields: the window's thread is the agent, the window its
    context, a sub-agent's parent thread its parent (the root thread's window: ``root``
    and ``window`` too, for :func:`_codex_under`). Empty without a window id."""
    window_id = given.get("context_id")
    if window_id is None:
        return {}
    thread, sep, window = window_id.rpartition(":")
    if not sep or not thread:
        raise BadRequest(f"header x-codex-window-id must be '<thread id>:<window number>' "
                         f"(got {window_id!r})", code="invalid_agent_header")
    fields = {"agent_id": thread, "context_id": window_id, "window": window}
    if "parent_agent_id" in given:
        fields["parent_agent_id"] = given["parent_agent_id"]
        fields["root"] = given.get("root", "")
    return fields


def _codex_under(codex: dict[str, str], named: dict[str, str], base: str) -> dict[str, str]:
    """A Codex thread inside the agent a harness named: a root thread is that agent (each
    window after the first a context of its own), a sub-agent thread a sub-agent of it
    (or of the sub-agent thread it names)."""
    if "parent_agent_id" in codex:
        parent = codex["parent_agent_id"]
        agent = named.get("agent_id", base)
        return {"agent_id": codex["agent_id"], "context_id": codex["context_id"],
                "parent_agent_id": agent if parent == codex["root"] else parent}
    if codex["window"] in ("0", "") or "context_id" in named:
        return named
    return {**named, "context_id": f"{base}:{codex['window']}"}
