"""``qwen36``: Qwen3.6 (248k vocabulary, Qwen3-Coder XML tool calls).

- Template: the publisher's, unchanged (bundled copy of
  ``qwen3.8/chat_template_qwen3.6.jinja``; a test checks they are equal). As published it
  drops the reasoning of assistant turns before the last user query: not append-only.
- Pinned: ``preserve_thinking=True`` (every history turn keeps its think block).
- Tolerated: ``enable_thinking`` per request (prompt ``<think>\\n``, or
  ``<think>\\n\\n</think>\\n\\n`` when off), from ``chat_template_kwargs``, OpenAI
  ``reasoning_effort`` / Responses ``reasoning.effort`` (``none``/``minimal``: off) and
  Anthropic ``thinking``.
- Refused: a system message after the first (the template raises): appends are ``tool``,
  ``user``, ``assistant``, a system append is a 400 naming the family;
  ``preserve_thinking=false`` (400 ``template_kwarg_conflict``). It requires a user query:
  the bridge base carries a dummy user.
- Junction: ``<|im_end|>`` then ``\\n``. Stops: ``<|im_end|>``, ``<|endoftext|>``.
- Format limits: as ``qwen38`` (content trailing whitespace trimmed; JSON-looking string
  arguments parse as JSON).
- Tokenizer: real, the Qwen3.5/3.6 one (``qwen3.5/``); ``--tokenizer standin`` builds a
  stand-in with the Qwen special tokens.
"""

from __future__ import annotations

from tito.parse.xml_coder import XmlCoderParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.render.families.qwen38 import STANDIN, STANDIN_EOS, STOPS
from tito.types.tokenizer import Tokenizer

FIXTURE = "qwen3.5"
TEMPLATE_FIXTURE = "qwen3.8/chat_template_qwen3.6.jinja"
"""The publisher's template the bundled copy must equal (tests check it)."""
__all__ = ["FIXTURE", "STANDIN", "STANDIN_EOS", "TEMPLATE_FIXTURE", "build"]


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="qwen36",
        template=template or bundled_template("qwen36.jinja"),
        pinned_kwargs={"preserve_thinking": True},
        allowed_append_roles=frozenset({"tool", "user", "assistant"}),
        assistant_start="<|im_start|>assistant",
        stop_tokens=STOPS,
        thinking_kwarg="enable_thinking",
        bridge_base_user=True,
        turn_openers=("<|im_start|>",),
    )
    parser = XmlCoderParser(tokenizer, stop_texts=STOPS, think_opened_by_prompt=True)
    return TemplateRenderer(tokenizer, spec, parser)
