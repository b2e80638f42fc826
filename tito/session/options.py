"""The render options of a path (design §5): the tools and the chat-template options its
turns were rendered with are part of its history, like its messages.

A request that changes them cannot extend the path bit for bit (the template would put
the new tools or options where the stored prefix has the old ones): v1 refuses it with a
400 naming the change, v2 starts a new root. A request that leaves them out keeps the
recorded ones (:func:`keep_options`: its turn renders, and its record lists, the path's
options, so a comparator that renders the path under a turn's options sees the ones the
path was rendered with, e.g. inkling's or gpt-oss's effort at the top of the prompt).
An explicit OpenAI effort is an option like the others (every effort that turns thinking
on sets the family's level), so asking ``low`` on a path rendered at ``max`` is a change,
not a silent ``max``. The family's thinking switch is a per-turn option where it changes
only the generation prompt, and a render option where it changes the text before it
(``FamilySpec.thinking_in_prefix``: a system instruction, e.g. qwen38, kimi_k3,
minimax_m3, gemma4; deepseek_v4's maximum-effort preamble).
"""

from __future__ import annotations

from typing import Any

from tito.render.base import TemplateRenderer
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


_UNSET = object()


def _kept(kwargs: dict[str, Any] | None, asked: dict[str, Any],
          renderer: TemplateRenderer) -> dict[str, Any]:
    """The recorded ``kwargs`` a request that sets ``asked`` keeps: its render options (the
    thinking switch only where it is one, :meth:`TemplateRenderer.render_options`)."""
    recorded = kwargs or {}
    options = renderer.render_options(recorded)
    return {k: v for k, v in recorded.items() if k not in asked and k in options}


def _show(value: Any) -> str:
    return "unset" if value is _UNSET else repr(value)


def options_change(tools: list[dict[str, Any]] | None, kwargs: dict[str, Any] | None,
                   request: TurnRequest, renderer: TemplateRenderer) -> str | None:
    """What ``request`` changes in a path rendered with ``tools`` and chat-template
    ``kwargs`` (None: nothing, or it leaves them out): a render option it sets (an OpenAI
    effort sets the family's level, :meth:`TemplateRenderer.effort_kwargs`) to another
    value than the path's, the template's default counting as the value of an unset one."""
    changes = []
    if request.tools is not None and request.tools != (tools or []):
        changes.append(_tools_change(tools or [], request.tools))
    asked = request.template_kwargs or {}
    if asked:
        before = renderer.render_options(kwargs)
        after = renderer.render_options({**_kept(kwargs, asked, renderer), **asked})
        diffs = [f"{k} {_show(before.get(k, _UNSET))} -> {_show(after.get(k, _UNSET))}"
                 for k in sorted(set(before) | set(after))
                 if before.get(k, _UNSET) != after.get(k, _UNSET)]
        if diffs:
            changes.append(f"chat_template_kwargs ({'; '.join(diffs)})")
    return " and ".join(changes) or None


def keep_options(kwargs: dict[str, Any] | None, request: TurnRequest,
                 renderer: TemplateRenderer) -> None:
    """Give ``request`` (it extends a path rendered with chat-template ``kwargs``, and
    :func:`options_change` found no change) the recorded render options it leaves out;
    the thinking switch, a per-turn option where it changes only the generation prompt,
    is not carried over there."""
    asked = request.template_kwargs or {}
    missing = _kept(kwargs, asked, renderer)
    if missing:
        request.template_kwargs = {**missing, **asked}
