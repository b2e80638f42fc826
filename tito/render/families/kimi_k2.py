"""``kimi_k2``: Kimi K2 / K2-Thinking (K2.5 / K2.6 with their own template: ``kimi_k25``).

- Template: ours, after K2-Thinking's: ``preserve_thinking=True`` (pinned) keeps
  ``<think>R</think>`` on every assistant (upstream keeps it only after the last plain answer).
- Junction: concatenation (``<|im_end|>`` has no trailing newline). All roles append.
- Calls: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
  <|tool_call_argument_begin|>JSON<|tool_call_end|>…``; the model-emitted id is kept.
- Comparator: every special token except ``<|im_middle|>`` (an intra-turn separator).
- Tokenizer: not available offline: a stand-in with Kimi's special tokens.
"""

from __future__ import annotations

import re
from typing import Any

from tito.parse.kimi import KimiParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = None
STOPS = ("<|im_end|>",)
STANDIN = ("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
           "<|im_middle|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
           "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
           "<think>", "</think>")
STANDIN_EOS = "<|im_end|>"


_KIMI_ID = re.compile(r"^functions\.[\w\-.]+:\d+$")


class KimiRenderer(TemplateRenderer):
    """Kimi's call id carries the function name (``functions.NAME:IDX``): other ids (an
    agent's ``call_…``) are rendered as ``functions.NAME:I`` (I: position in the message),
    and tool results that answer them follow the same mapping."""

    def prepare_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        mapping: dict[str, str] = {}
        out = []
        for m in messages:
            if m.get("tool_calls"):
                calls = []
                for i, c in enumerate(m["tool_calls"]):
                    cid = str(c.get("id") or "")
                    if not _KIMI_ID.match(cid):
                        new = f"functions.{(c.get('function') or {}).get('name', '')}:{i}"
                        mapping[cid] = new
                        c = {**c, "id": new}
                    calls.append(c)
                m = {**m, "tool_calls": calls}
            elif m.get("role") == "tool" and m.get("tool_call_id") in mapping:
                m = {**m, "tool_call_id": mapping[m["tool_call_id"]]}
            out.append(m)
        return out


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    specials = tuple(sorted(
        t for i in tokenizer.special_ids
        if (t := tokenizer.id_to_token(i)) is not None and t != "<|im_middle|>"))
    spec = FamilySpec(
        name="kimi_k2",
        template=template or bundled_template("kimi_k2.jinja"),
        pinned_kwargs={"preserve_thinking": True},
        assistant_start="<|im_assistant|>",
        stop_tokens=STOPS,
        comparator_special=specials,
        turn_openers=("<|im_user|>", "<|im_assistant|>", "<|im_system|>"),
    )
    return KimiRenderer(tokenizer, spec, KimiParser(tokenizer, stop_texts=STOPS))
