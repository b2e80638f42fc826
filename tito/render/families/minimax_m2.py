"""``minimax_m2``: MiniMax-M2 / M2.5 / M2.7 (``]~b]ROLE`` … ``[e~[`` framing).

- Template: the publisher's, corrected: ``clear_thinking=False`` (pinned) renders every
  assistant's ``<think>\\nR\\n</think>\\n\\n`` (the generation prompt opens it).
- Junction: the model stops at ``[e~[``; the render continues with ``\\n`` (read off).
- Later system messages are not rendered upstream (they would vanish): appends are ``tool``,
  ``user``, ``assistant``.
- Calls: ``<minimax:tool_call><invoke name=…><parameter name=…>V</parameter></invoke>…``.
- Tokenizer: not available offline: a stand-in with MiniMax's markers as special tokens.
"""

from __future__ import annotations

from tito.parse.minimax import MiniMaxParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = None
STOPS = ("[e~[",)
STANDIN = ("]~!b[", "]~b]", "[e~[", "<think>", "</think>", "<minimax:tool_call>",
           "</minimax:tool_call>")
STANDIN_EOS = "[e~["


def build(tokenizer: Tokenizer, template: str | None, *, name: str = "minimax_m2",
          bundled: str = "minimax_m2.jinja") -> TemplateRenderer:
    """The renderer (``name``/``bundled``: a sibling with its own template, minimax_m25)."""
    spec = FamilySpec(
        name=name,
        template=template or bundled_template(bundled),
        pinned_kwargs={"clear_thinking": False},
        allowed_append_roles=frozenset({"tool", "user", "assistant"}),
        assistant_start="]~b]ai",
        stop_tokens=STOPS,
        turn_openers=("]~b]",),
    )
    parser = MiniMaxParser(tokenizer, stop_texts=STOPS, think_opened_by_prompt=True)
    return TemplateRenderer(tokenizer, spec, parser)
