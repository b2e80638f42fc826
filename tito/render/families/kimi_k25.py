"""``kimi_k25``: Kimi K2.5 / K2.6 (kimi_k2's markers; the K2.5 template).

- Template: Kimi K2.5's as miles patched it (bundled unchanged): no default system prompt,
  a compact tool declaration, a ``thinking`` switch.
- Pinned: ``preserve_thinking=True``. Upstream drops the reasoning of the turns up to the
  last plain answer; pinned, every assistant keeps ``<think>R</think>`` (append-only).
  ``preserve_thinking=False`` in a request is a 400 (``template_kwarg_conflict``).
- Thinking per request (``thinking``, default on; OpenAI effort ``none``/``minimal`` off;
  Anthropic ``thinking``): prompt ``<think>``, or ``<think></think>`` and every assistant
  rendered with an empty block when off. Switching it within a session is tolerated: the
  switch changes no text before the generation prompt; the template would show earlier
  reasoning as an empty block when off, but each bridge appends only the new messages
  (the ids stay what the model saw) and the comparator compares each turn's new segments
  under that turn's own options: no mismatch (tested), as for glm47.
- Junction: concatenation (``<|im_end|>`` has no trailing newline). All roles append.
- Calls: kimi_k2's (``functions.NAME:IDX`` ids; other ids are mapped as kimi_k2 does).
- Tolerated: an assistant's ``reasoning_content: null`` is dropped before rendering (the
  template would print ``None``). Reasoning renders unstripped: the parser keeps it exactly.
- Tokenizer: not available offline: kimi_k2's stand-in (Kimi's special tokens).
"""

from __future__ import annotations

from typing import Any

from tito.parse.kimi import KimiParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.render.families.kimi_k2 import STANDIN, STANDIN_EOS, STOPS, KimiRenderer
from tito.types.tokenizer import Tokenizer

__all__ = ["FIXTURE", "STANDIN", "STANDIN_EOS", "STOPS", "build"]

FIXTURE = None
TEMPLATE_FIXTURE = ("kimi-k3", "chat_template_kimi-k2.5_miles-patched.jinja")
"""The fixture template the bundled one is a copy of (checked by the tests)."""


class KimiK25Renderer(KimiRenderer):
    def prepare_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for m in super().prepare_messages(messages):
            if "reasoning_content" in m and m["reasoning_content"] is None:
                m = {k: v for k, v in m.items() if k != "reasoning_content"}
            out.append(m)
        return out


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    specials = tuple(sorted(
        t for i in tokenizer.special_ids
        if (t := tokenizer.id_to_token(i)) is not None and t != "<|im_middle|>"))
    spec = FamilySpec(
        name="kimi_k25",
        template=template or bundled_template("kimi_k25.jinja"),
        pinned_kwargs={"preserve_thinking": True},
        assistant_start="<|im_assistant|>",
        stop_tokens=STOPS,
        thinking_kwarg="thinking",
        comparator_special=specials,
        turn_openers=("<|im_user|>", "<|im_assistant|>", "<|im_system|>"),
    )
    parser = KimiParser(tokenizer, stop_texts=STOPS, think_opened_by_prompt=True,
                        exact_reasoning=True)
    return KimiK25Renderer(tokenizer, spec, parser)
