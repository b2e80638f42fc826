"""``minimax_m3``: MiniMax-M3 (``]~b]ROLE`` … ``[e~[`` framing, namespaced XML tool calls).

- Template: llama.cpp's copy of the publisher's, with one correction: with
  ``thinking_mode="enabled"`` an assistant turn without reasoning renders the empty block
  ``<mm:think></mm:think>`` (published: a bare ``</mm:think>``, which breaks the prefix the
  generation prompt ``<mm:think>`` opened). Reasoning is rendered for every assistant turn
  (published), so history is append-only without a pinned kwarg.
- Thinking: ``thinking_mode`` takes ``enabled`` / ``disabled`` / ``adaptive`` (the default:
  no prompt prefix, the model opens ``<mm:think>`` or answers after ``</mm:think>``). The
  API switches (a boolean: ``reasoning_effort``, Anthropic ``thinking``, or
  ``chat_template_kwargs`` ``thinking_mode: true/false``) map to ``enabled`` / ``disabled``
  (Anthropic's ``adaptive`` type too is "on": send no switch for the adaptive default).
  The mode is written into the system message, so it is a session option: a turn that
  switches it is a 400 ``render_changed`` (v1) or a new root (v2); a turn that leaves it
  out keeps the session's.
- Junction: the model stops at ``[e~[``; the render continues with ``\\n``.
- Later system messages are not rendered upstream (they would vanish): appends are ``tool``,
  ``user``, ``assistant``.
- Calls: ``]<]minimax[>[<tool_call>`` … every tag prefixed (:mod:`tito.parse.minimax_m3`).
  Format limits: a string argument that reads as a number or a boolean comes back as one,
  an empty object or array as ``""``, ``None`` values are not rendered.
- Verified in the three modes (the matrix shows enabled/disabled; ``adaptive`` with
  ``--kwargs '{"thinking_mode": "adaptive"}'``).
- Tokenizer: not available offline: a stand-in with M3's markers as special tokens.
"""

from __future__ import annotations

from typing import Any

from tito.parse.minimax_m3 import NS, MiniMaxM3Parser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = None
STOPS = ("[e~[",)
STANDIN = ("]~!b[", "]~b]", "[e~[", "<mm:think>", "</mm:think>", NS, "]<]image[>[",
           "]<]video[>[")
STANDIN_EOS = "[e~["
MODES = {True: "enabled", False: "disabled"}


class MiniMaxM3Renderer(TemplateRenderer):
    """``thinking_mode`` is a string: the API's boolean switch is mapped to it."""

    def effective_kwargs(self, request_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        merged = super().effective_kwargs(request_kwargs)
        mode = merged.get("thinking_mode")
        if isinstance(mode, bool):
            merged["thinking_mode"] = MODES[mode]
        return merged

    def thinking_variants(self) -> list[dict[str, Any]]:
        return [{"thinking_mode": True}, {"thinking_mode": False},
                {"thinking_mode": "adaptive"}]

    def thinking_option(self, kwargs: dict[str, Any] | None) -> Any:
        """The mode (unset: the template's own default, no instruction)."""
        return self.effective_kwargs(kwargs).get("thinking_mode")

    def thinking_enabled(self, template_kwargs: dict[str, Any] | None) -> bool:
        return self.effective_kwargs(template_kwargs).get("thinking_mode") != "disabled"


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="minimax_m3",
        template=template or bundled_template("minimax_m3.jinja"),
        allowed_append_roles=frozenset({"tool", "user", "assistant"}),
        assistant_start="]~b]ai",
        stop_tokens=STOPS,
        thinking_kwarg="thinking_mode",
        thinking_in_prefix=True,
        turn_openers=("]~b]",),
    )
    return MiniMaxM3Renderer(tokenizer, spec, MiniMaxM3Parser(tokenizer, stop_texts=STOPS))
