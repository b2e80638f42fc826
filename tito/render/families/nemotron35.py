"""``nemotron35``: NVIDIA Nemotron 3.5 Lightning.

- Template: the publisher's (bundled copy of the fixture): ChatML frame, tools as XML in
  the system turn, Qwen3-Coder XML tool calls, tool results in a ``user`` turn. As
  published, ``truncate_history_thinking`` (default on) empties the reasoning of assistant
  turns before the last user message (not append-only): it is pinned off. One correction
  (marked ``TITO fix``): with thinking on, an assistant turn without reasoning renders
  ``<think>\n</think>`` (what the model emits after the prompt's ``<think>\n``) instead of
  ``<think></think>``, which no generation can produce.
- Junction: ``<|im_end|>`` then ``\\n``. All roles append (system renders in place).
- Thinking per request (``enable_thinking``): prompt ``<think>\\n`` or ``<think></think>``.
- Tokenizer: not available offline: a documented stand-in (``tokenizer standin``).
"""

from __future__ import annotations

from tito.parse.xml_coder import XmlCoderParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = None
TEMPLATE_FIXTURE = "nemotron-3.5/chat_template.jinja"
"""The publisher's template the bundled copy follows (tests check the one difference)."""
STOPS = ("<|im_end|>",)
STANDIN = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
           "<tool_call>", "</tool_call>")
STANDIN_EOS = "<|im_end|>"


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="nemotron35",
        template=template or bundled_template("nemotron35.jinja"),
        pinned_kwargs={"truncate_history_thinking": False},
        assistant_start="<|im_start|>assistant",
        stop_tokens=STOPS,
        thinking_kwarg="enable_thinking",
        turn_openers=("<|im_start|>",),
    )
    parser = XmlCoderParser(tokenizer, stop_texts=STOPS, think_opened_by_prompt=True)
    return TemplateRenderer(tokenizer, spec, parser)
