"""``nemotron35``: NVIDIA Nemotron 3.5 Lightning.

- Template: the publisher's (bundled copy of ``nemotron-3.5/chat_template.jinja``): ChatML
  frame, tools as XML in the system turn, Qwen3-Coder XML tool calls, tool results in a
  ``user`` turn. One correction (marked ``TITO fix``; a test checks it is the only
  difference): with thinking on, an assistant turn without reasoning renders
  ``<think>\\n</think>`` (what the model emits after the prompt's ``<think>\\n``) instead of
  ``<think></think>``, which no generation with thinking on can produce.
- Pinned: ``truncate_history_thinking=False`` (its default, on, empties the reasoning of
  assistant turns before the last user message: not append-only).
- Tolerated: every role appends (a later system message renders in place);
  ``enable_thinking`` per request (prompt ``<think>\\n``, or ``<think></think>`` when off),
  from ``chat_template_kwargs``, OpenAI ``reasoning_effort`` / Responses
  ``reasoning.effort`` (``none``/``minimal``: off) and Anthropic ``thinking``.
- Refused: ``truncate_history_thinking=true`` (400 ``template_kwarg_conflict``).
- Junction: ``<|im_end|>`` then ``\\n``. Stop: ``<|im_end|>``.
- Format limits: booleans and ``null`` arguments render the Python way (``True``,
  ``None``: the template's ``| string``); they parse back as a boolean and null, so a
  string argument that is exactly ``True``, ``False`` or ``None`` comes back as one; content
  trailing whitespace is trimmed.
- Tokenizer: not available offline: a documented stand-in (``--tokenizer standin``).
"""

from __future__ import annotations

from tito.render.base import TemplateRenderer
from tito.render.families import nemotron3
from tito.types.tokenizer import Tokenizer

FIXTURE = None
TEMPLATE_FIXTURE = "nemotron-3.5/chat_template.jinja"
"""The publisher's template the bundled copy follows (tests check the one difference)."""
STOPS = nemotron3.STOPS
STANDIN = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
           "<tool_call>", "</tool_call>")
STANDIN_EOS = "<|im_end|>"


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    return nemotron3.build(tokenizer, template, name="nemotron35", bundled="nemotron35.jinja")
