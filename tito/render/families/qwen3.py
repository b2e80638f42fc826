"""``qwen3``: Qwen3 hybrid-thinking models.

- Template: our corrected Qwen3 template with ``clear_thinking=False`` pinned, so history
  ``<think>`` blocks render wherever the message stands (append-only for every role).
- Junction: the model stops at ``<|im_end|>``; the render continues with ``\\n``.
- Thinking per request with ``chat_template_kwargs.enable_thinking``.
- Completions: ``<think>..</think>`` then Hermes ``<tool_call>{json}</tool_call>`` blocks.
"""

from __future__ import annotations

from tito.parse.hermes import HermesParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="qwen3",
        template=template or bundled_template("qwen3.jinja"),
        pinned_kwargs={"clear_thinking": False},
        assistant_start="<|im_start|>assistant",
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        thinking_kwarg="enable_thinking",
    )
    return TemplateRenderer(tokenizer, spec, HermesParser(tokenizer))
