"""``gemma4``: Gemma 4 (``<|turn>ROLE\\n`` … ``<turn|>``; tool results inside the model turn).

- Template: ours, after google/gemma-4-E2B-it's current revision (8995379). Published, it is
  not append-only: reasoning (``<|channel>thought\\nR\\n<channel|>``) is shown only after the
  last user turn (``preserve_thinking`` keeps it for tool-call turns only), the text of a
  tool-call turn is rendered after its tool results, and an assistant after an assistant
  loses its ``<turn|>``. Our changes (each marked ``TITO fix`` in ``gemma4.jinja``):
  ``preserve_thinking=True`` (pinned) keeps the reasoning of every model turn; the text comes
  before the calls; only a turn whose tool results were rendered continues; with thinking on
  every model turn has its thought block (empty without reasoning) and the generation prompt
  opens it after a user turn too (published: only after tool results).
- ``empty_thought=true`` (our kwarg, default off) gives Gemma-4-31B-it's thinking-off
  generation prompt ``<|turn>model\\n<|channel>thought\\n<channel|>``; the model turns it
  opened render the same empty block, so the prefix holds.
- Junction: the model stops at ``<turn|>`` (the render continues with ``\\n``) or, after its
  calls, at ``<|tool_response>``, which opens the results: the model turn continues after
  them (no new ``<|turn>model``). All roles append (a later system message is a turn).
- Thinking (``enable_thinking``, default off) also writes ``<|think|>`` into the system
  turn, so it is a session option: a turn that switches it is a 400 ``render_changed``
  (v1) or a new root (v2); a turn that leaves it out keeps the session's.
- Refused: ``preserve_thinking=false`` (400 ``template_kwarg_conflict``). Format limit: a
  string argument holding ``<|"|>`` (Gemma's string mark) cannot be parsed back.
- Other revisions: the release one (4742fe8) passes the verifier only because it never
  renders reasoning (a model's thought would vanish from the history) and it renders OpenAI
  tool messages as turns of their own; 31B-it's (E2B's b446025c plus the empty thought
  block) breaks the prefix like the current one. This family's template serves all sizes.
- Tokenizer: not available offline: a stand-in with Gemma 4's control tokens.
"""

from __future__ import annotations

from typing import Any

from tito.parse.gemma import QUOTE, GemmaParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = None
STOPS = ("<turn|>", "<|tool_response>")
STANDIN = ("<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|think|>", "<|channel>",
           "<channel|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>",
           "<|tool_response>", "<tool_response|>", QUOTE, "<|image|>", "<|audio|>",
           "<|video|>")
STANDIN_EOS = "<turn|>"


class GemmaRenderer(TemplateRenderer):
    def completion_stop_text(self, message: dict[str, Any]) -> str:
        return "<|tool_response>" if message.get("tool_calls") else "<turn|>"


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="gemma4",
        template=template or bundled_template("gemma4.jinja"),
        pinned_kwargs={"preserve_thinking": True},
        assistant_start="<|turn>model",
        stop_tokens=STOPS,
        bos_token="<bos>",
        thinking_kwarg="enable_thinking",
        thinking_default=False,
        thinking_in_prefix=True,
        turn_openers=("<|turn>", "<|tool_response>", "<tool_response|>"),
        assistant_openers=("<|turn>model", "<tool_response|>"),
    )
    return GemmaRenderer(tokenizer, spec, GemmaParser(tokenizer, stop_texts=STOPS))
