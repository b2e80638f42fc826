"""``inkling``: Inkling / Inkling-Small (Thinking Machines).

- Template: the checkpoint's with miles' upstream fixes (no empty text block, no bare
  terminator for an empty turn), bundled byte for byte; append-only as is, nothing pinned.
  Each message is ``<|message_ROLE|>[NAME]<|content_KIND|>BODY<|end_message|>``.
- One assistant message is several model messages: its reasoning
  (``<|content_thinking|>``), its text (``<|content_text|>``), then one message per tool call
  (``NAME<|content_invoke_tool_json|>{"name":…,"args":{…}}``, sorted compact JSON), then
  ``<|content_model_end_sampling|>``, the stop token. The parser reassembles one message
  (content, reasoning_content, tool_calls, parallel calls included).
- Junction: none (the next message follows the stop token). All roles append (a system
  message renders in place); a tool result is named after its call (``tool_call_id``).
- Reasoning effort: a ``Thinking effort level: X`` system message before the first
  non-system message, always rendered (default 0.9). OpenAI's ``reasoning_effort`` and
  Responses' ``reasoning.effort`` set the template's ``reasoning_effort`` (none, minimal,
  low, medium, high; ``xhigh`` -> ``max``); Anthropic ``thinking`` disabled -> ``none``,
  enabled -> ``high`` (0.9, the default). The level sits in the prompt's first turn, so it
  is a render option of the session: a later turn that changes it is refused (v1, 400
  ``render_changed``) or starts a new root (v2); a turn that leaves it out keeps it.
  The model's thinking has no switch: it may reason at any level (mode ``always``).
- Pinned: nothing. Tolerated: any effort on the first turn, the same effort (or none sent)
  later. Refused: a later turn with another effort.
- Format limits: a re-render orders thinking, text, calls and merges several text messages
  into one (the session keeps the model's own ids; only a re-render from messages differs);
  an empty generated turn (only the stop token) renders as nothing in history (the fixed
  template drops it): the session keeps the model's ids and the comparator reports a
  ``special_token_count`` mismatch; a tool result for a call of an earlier turn than the
  last is named only in a full render (the bridge sees the last turn's calls).
- Tokenizer: not available offline (~200k vocabulary): a stand-in with the template's
  special tokens (``--tokenizer standin``).
"""

from __future__ import annotations

from typing import Any

from tito.parse.inkling import END, INVOKE, MODEL, STOP, TEXT, THINKING, InklingParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = None
OPENERS = ("<|message_system|>", "<|message_user|>", MODEL, "<|message_tool|>")
STANDIN = (*OPENERS, TEXT, THINKING, INVOKE, "<|content_xml|>", "<|content_image|>",
           "<|content_audio_input|>", "<|audio_end|>", END, STOP, "<|unused_200053|>",
           "<|unused_200054|>")
STANDIN_EOS = STOP
EFFORTS = {"none": "none", "minimal": "minimal", "low": "low", "medium": "medium",
           "high": "high", "xhigh": "max"}
"""OpenAI reasoning efforts -> the template's ``reasoning_effort`` level."""


class InklingRenderer(TemplateRenderer):
    def thinking_switch_kwargs(self, on: bool) -> dict[str, Any]:
        """Anthropic ``thinking``: the effort level (Inkling has no on/off switch)."""
        return self.effort_kwargs("high" if on else "none")


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="inkling",
        template=template or bundled_template("inkling.jinja"),
        assistant_start=MODEL,
        stop_tokens=(STOP,),
        eos_token=STOP,
        turn_openers=OPENERS,
        effort_kwarg="reasoning_effort",
        effort_levels=EFFORTS,
        effort_default="high",
    )
    return InklingRenderer(tokenizer, spec, InklingParser(tokenizer, stop_texts=(STOP,)))
