"""``nemotron3``: NVIDIA Nemotron 3 Nano / Super / Ultra.

- Template: ours, after the publisher's (ChatML frame, Qwen3-Coder XML tool calls); history
  reasoning renders exactly as emitted wherever the message stands
  (``truncate_history_thinking=False`` pinned, as upstream's kwarg).
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
STOPS = ("<|im_end|>",)
STANDIN = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
           "<tool_call>", "</tool_call>")
STANDIN_EOS = "<|im_end|>"


def build(tokenizer: Tokenizer, template: str | None, *, name: str = "nemotron3",
          bundled: str = "nemotron3.jinja") -> TemplateRenderer:
    """The renderer (``name``/``bundled``: a sibling with its own template, nemotron35)."""
    spec = FamilySpec(
        name=name,
        template=template or bundled_template(bundled),
        pinned_kwargs={"truncate_history_thinking": False},
        assistant_start="<|im_start|>assistant",
        stop_tokens=STOPS,
        thinking_kwarg="enable_thinking",
        turn_openers=("<|im_start|>",),
    )
    parser = XmlCoderParser(tokenizer, stop_texts=STOPS, think_opened_by_prompt=True,
                            python_literals=True)
    return TemplateRenderer(tokenizer, spec, parser)
