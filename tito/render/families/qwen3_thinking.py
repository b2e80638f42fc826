"""``qwen3_thinking``: Qwen3-Thinking-2507 and Qwen3-Next-Thinking (always thinking).

- Template: our corrected Qwen3 template whose generation prompt opens ``<think>\\n`` (as
  Thinking-2507's does); ``clear_thinking=False`` pinned: history reasoning always renders.
- Junction: ``<|im_end|>`` then ``\\n`` (read off the render). All roles append.
- Completions: reasoning up to ``</think>`` (the opening tag is in the prompt), then Hermes
  ``<tool_call>{json}</tool_call>`` blocks.
- Tokenizer: Qwen3's (the Thinking-2507 tokenizer.json is byte-identical).
"""

from __future__ import annotations

from tito.parse.hermes import HermesParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = "qwen3"


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="qwen3_thinking",
        template=template or bundled_template("qwen3_thinking.jinja"),
        pinned_kwargs={"clear_thinking": False},
        assistant_start="<|im_start|>assistant",
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        turn_openers=("<|im_start|>",),
    )
    return TemplateRenderer(tokenizer, spec, HermesParser(tokenizer, think_opened_by_prompt=True))
