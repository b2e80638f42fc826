"""Bridge stand-ins: the bridge of a turn rendered without the session's tool list and the
previous turn's tool calls, once that is checked to give the same bridge.

A bridge (:meth:`tito.render.base.TemplateRenderer.bridge`) renders a synthetic base (a
dummy system message, the previous assistant turn with its tool calls) and the appended
messages with the request's tools, and keeps the text after the base. Chat templates put
the tool list in the system block, before the base's assistant turn, so the text after it
does not depend on the tools; for most templates it does not depend on the previous
calls' names and arguments either. But a base keyed by the previous turn's calls is new
every turn of an agent that calls tools, so every turn rendered the whole tool list
(Claude Code's 13 tools: ~30 KB, 75% of a render) twice, and no skeleton
(:mod:`tito.render.skeleton`) was ever reused.

A *stand-in* replaces the tool list by a small one (each tool by its name only) and the
previous turn's calls by fixed calls (same count, fixed ids, names and arguments): the
stand-in base's key is the same every turn, so its render is cached and the appended
messages fill a skeleton. Whether a template gives the stand-in's bridge is checked per
*slot* (the tool list, the template kwargs, the number of previous calls, and the roles
and fields of the appended messages: what the template's branches depend on), against
the template's own render of the real messages, on the slot's first
:data:`CHECKS` uses; a slot whose checks all agreed takes the stand-in from then on, a
slot where one differed (e.g. a template that renders tools next to the last user
message, or names a tool response after its call) never does. The tool list is thus
rendered on a slot's first uses, not every turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from tito.types.messages import Message

CHECKS = 2
"""Uses of a slot whose stand-in bridge is compared with the template's render before the
slot trusts it (two: two turns' different contents and calls)."""
SLOTS = 4096
"""How many slots are remembered (then they start over, and are checked again)."""


def standin_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The tool list with each tool cut to its type and name (OpenAI's function shape; a
    tool of another shape is kept as it is)."""
    if not tools:
        return tools
    out: list[dict[str, Any]] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        out.append({"type": tool.get("type", "function"), "function": {"name": name}}
                   if isinstance(name, str) else tool)
    return out


def standin_previous(previous: Message | None) -> Message | None:
    """``previous`` with its tool calls (if any) replaced by fixed ones of the same
    count."""
    calls = previous.get("tool_calls") if previous else None
    if not calls or previous is None:
        return previous
    return {**previous, "tool_calls": [
        {"id": f"standin{i:02d}"[-9:], "type": "function",
         "function": {"name": "standin", "arguments": "{}"}} for i in range(len(calls))]}


def slot_of(previous: Message | None, appended: Sequence[Message],
            tools: list[dict[str, Any]] | None,
            template_kwargs: dict[str, Any] | None) -> bytes | None:
    """What a stand-in's check holds for; None: no stand-in (values that are not JSON)."""
    calls = previous.get("tool_calls") if previous else None
    shape = [[m.get("role"), *sorted(m)] for m in appended]
    try:
        return orjson.dumps([tools, template_kwargs, len(calls or ()), shape])
    except TypeError:
        return None


class StandIns:
    """Per slot: how many checks agreed (:data:`CHECKS`: trusted), or -1 (one differed)."""

    def __init__(self) -> None:
        self._agreed: dict[bytes, int] = {}

    def trusted(self, slot: bytes) -> bool:
        return self._agreed.get(slot, 0) >= CHECKS

    def record(self, slot: bytes, same: bool) -> None:
        """One check of ``slot``: the stand-in gave the template's bridge (or not)."""
        agreed = self._agreed.get(slot, 0)
        if agreed < 0:
            return
        if len(self._agreed) >= SLOTS and slot not in self._agreed:
            self._agreed.clear()
        self._agreed[slot] = agreed + 1 if same else -1
