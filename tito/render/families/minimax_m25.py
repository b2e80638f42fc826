"""``minimax_m25``: MiniMax-M2.5 (and M2.7: the same template but its identity line).

- Template: miles' patched M2.5 template (``clear_thinking``), corrected: with
  ``clear_thinking=False`` (pinned) every assistant renders ``<think>\\nR\\n</think>\\n\\n``,
  also when ``R`` is empty (miles' patch drops an empty block, which breaks the prefix the
  generation prompt ``<think>\\n`` opened). Otherwise the format of ``minimax_m2``.
- Junction: the model stops at ``[e~[``; the render continues with ``\\n``.
- Later system messages are not rendered: appends are ``tool``, ``user``, ``assistant``
  (a ``system`` append is a 400 ``role_not_allowed``; ``clear_thinking=true`` a 400
  ``template_kwarg_conflict``).
- Calls: ``<minimax:tool_call><invoke name=…><parameter name=…>V</parameter></invoke>…``.
- Tokenizer: not available offline: a stand-in with MiniMax's markers as special tokens.
"""

from __future__ import annotations

from tito.render.base import TemplateRenderer
from tito.render.families import minimax_m2
from tito.render.families.minimax_m2 import STANDIN, STANDIN_EOS
from tito.types.tokenizer import Tokenizer

FIXTURE = None
__all__ = ["FIXTURE", "STANDIN", "STANDIN_EOS", "build"]


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    return minimax_m2.build(tokenizer, template, name="minimax_m25", bundled="minimax_m25.jinja")
