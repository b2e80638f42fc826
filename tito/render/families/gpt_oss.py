"""``gpt_oss``: gpt-oss (harmony format, o200k_harmony).

- Template: the publisher's, corrected to render append-only: reasoning renders as an
  ``analysis`` message wherever the assistant stands; a final answer closes with ``<|end|>``.
- Junction: the model stops at ``<|return|>`` (final) or ``<|call|>`` (tool call). History
  shows ``<|end|>`` where the model emitted ``<|return|>``: the stored ``<|return|>`` is
  dropped and ``<|end|>`` rendered (declared trailing trim: 1). ``<|call|>`` stays.
- All roles append (a later system message renders as a developer message).
- Reasoning effort: OpenAI's effort sets the template's ``reasoning_effort`` (``EFFORTS``).
- Completions: ``analysis`` -> reasoning, ``final``/``commentary`` -> content,
  ``to=functions.N`` -> tool calls.
"""

from __future__ import annotations

from typing import Any

from tito.parse.harmony import HarmonyParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = "gpt-oss"
STOPS = ("<|return|>", "<|call|>")
EFFORTS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium",
           "high": "high", "xhigh": "high"}
"""OpenAI reasoning efforts -> the template's ``Reasoning:`` level (gpt-oss always
reasons: ``none`` and ``minimal`` are its lowest level)."""


class HarmonyRenderer(TemplateRenderer):
    def completion_stop_text(self, message: dict[str, Any]) -> str:
        return "<|call|>" if message.get("tool_calls") else "<|return|>"


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="gpt_oss",
        template=template or bundled_template("gpt_oss.jinja"),
        assistant_start="<|start|>assistant",
        stop_tokens=STOPS,
        history_closers=("<|end|>",),
        max_trailing_trim=1,
        trailing_tokens=("<|return|>", "<|end|>", "<|call|>"),
        turn_openers=("<|start|>",),
        effort_kwarg="reasoning_effort",
        effort_levels=EFFORTS,
        effort_default="medium",
    )
    return HarmonyRenderer(tokenizer, spec, HarmonyParser(tokenizer, stop_texts=STOPS))
