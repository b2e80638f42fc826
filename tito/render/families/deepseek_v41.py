"""``deepseek_v41``: DeepSeek-V4.1 (DSML ``<｜DSML｜ calls>``: a space in every tag).

- Template: ours, a *reconstruction* from the public description of the format, not the
  publisher's file (its chat_template.jinja and encoding.py are not available offline):
  our ``deepseek_v4`` template with V4.1's tag spelling, a space after the DSML token in
  every tag and ``calls`` for ``tool_calls`` (``<｜DSML｜ calls>``, ``<｜DSML｜ invoke
  name="N">``, ``<｜DSML｜ parameter name="K" string="true|false">V</｜DSML｜ parameter>``).
  Everything else is V4's: ``drop_thinking=False`` pinned (history reasoning kept, tool and
  user appends append-only), tool results as ``<tool_result>`` in user turns.
- System messages are gathered at the top: appends are ``tool``, ``user``, ``assistant``.
- Thinking per request with ``thinking`` (default off); OpenAI's effort ``xhigh`` sets the
  template's ``reasoning_effort="max"`` (its maximum-effort preamble at the top of the
  prompt, rendered only with thinking on), ``low``/``medium``/``high`` set ``"high"`` (no
  preamble). The level is a session option: ``low`` after an ``xhigh`` turn is a 400
  ``render_changed`` (v1) or a new root (v2), and so is switching thinking off under
  ``max`` (the preamble would go).
- Pinned: ``drop_thinking=False``. Tolerated: thinking switched per turn without ``max``
  (it changes only the generation prompt). Refused: a system append (400
  ``role_not_allowed``), a request that contradicts the pin (400
  ``template_kwarg_conflict``).
- Stop: ``<｜end▁of▁sentence｜>``.
- Tokenizer: V4.1's is not available offline: a stand-in with DeepSeek's special tokens
  (``--tokenizer standin``). V4's ``tokenizer.json`` (``deepseek-v4/``) also works and is
  verified: its special tokens suffice (BOS, EOS, ``<｜User｜>``, ``<｜Assistant｜>``,
  ``<think>``, ``</think>`` and ``｜DSML｜`` as one id; the tag's space and name are BPE).
"""

from __future__ import annotations

from tito.render.base import TemplateRenderer
from tito.render.families import deepseek_v4
from tito.types.tokenizer import Tokenizer

FIXTURE = None
COMPATIBLE_FIXTURE = "deepseek-v4"
"""A real tokenizer folder this family is also verified over (V4's: same special tokens)."""
EOS, BOS = deepseek_v4.EOS, deepseek_v4.BOS
STANDIN = (BOS, EOS, "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜")
STANDIN_EOS = EOS


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    return deepseek_v4.build(tokenizer, template, name="deepseek_v41",
                             bundled="deepseek_v41.jinja", block="calls", tag_space=" ")
