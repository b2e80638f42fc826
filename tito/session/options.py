"""The render options of a path (design §5): the tools and the chat-template options its
turns were rendered with are part of its history, like its messages.

A request that changes them cannot extend the path bit for bit (the template would put
the new tools or options where the stored prefix has the old ones): v1 refuses it with a
400 naming the change, v2 starts a new root. A request that leaves them out keeps the
recorded ones (:func:`keep_options`: its turn renders, and its record lists, the path's
options, so a comparator that renders the path under a turn's options sees the ones the
path was rendered with, e.g. inkling's or gpt-oss's effort at the top of the prompt).
The family's thinking switch is a per-turn option (it changes only the generation
prompt) and is not compared.
"""

from __future__ import annotations

from typing import Any

from tito.types.messages import TurnRequest


def tool_name(tool: dict[str, Any]) -> str:
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else tool.get("name")
    return str(name) if name is not None else "?"


def _tools_change(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> str:
    old, new = [tool_name(t) for t in before], [tool_name(t) for t in now]
    added = [n for n in new if n not in old]
    removed = [n for n in old if n not in new]
    parts = []
    if added:
        parts.append(f"added {', '.join(added)}")
    if removed:
        parts.append(f"removed {', '.join(removed)}")
    if not parts:
        changed = [n for n, a, b in zip(old, before, now, strict=False) if a != b]
        parts.append(f"changed {', '.join(changed)}" if changed and old == new
                     else "reordered")
    return f"tools ({len(before)} -> {len(now)}: {'; '.join(parts)})"


def _options(kwargs: dict[str, Any] | None, thinking: str | None) -> dict[str, Any]:
    return {k: v for k, v in (kwargs or {}).items() if k != thinking}


def options_change(tools: list[dict[str, Any]] | None, kwargs: dict[str, Any] | None,
                   request: TurnRequest, thinking_kwarg: str | None) -> str | None:
    """What ``request`` changes in a path rendered with ``tools`` and chat-template
    ``kwargs`` (None: nothing, or it leaves them out)."""
    changes = []
    if request.tools is not None and request.tools != (tools or []):
        changes.append(_tools_change(tools or [], request.tools))
    asked = _options(request.template_kwargs, thinking_kwarg)
    recorded = _options(kwargs, thinking_kwarg)
    if asked and asked != recorded:
        keys = sorted(k for k in set(asked) | set(recorded) if asked.get(k) != recorded.get(k))
        changes.append(f"chat_template_kwargs ({', '.join(keys)})")
    return " and ".join(changes) or None


def keep_options(kwargs: dict[str, Any] | None, request: TurnRequest,
                 thinking_kwarg: str | None) -> None:
    """Give ``request`` (it extends a path rendered with chat-template ``kwargs``, and
    :func:`options_change` found no change) the recorded options it leaves out; the
    thinking switch, a per-turn option, is not carried over."""
    asked = request.template_kwargs or {}
    missing = {k: v for k, v in _options(kwargs, thinking_kwarg).items() if k not in asked}
    if missing:
        request.template_kwargs = {**missing, **asked}
