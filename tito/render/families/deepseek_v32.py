"""``deepseek_v32``: DeepSeek-V3.2 (DSML ``<｜DSML｜function_calls>`` tool calls).

- Template: llama.cpp's Jinja port of the official encoder, corrected: ``drop_thinking=False``
  (pinned) keeps history reasoning. With ``drop_thinking`` unset it reproduces the encoder's
  golden output in the fixtures exactly (tested).
- After tool results the generation prompt is ``\\n\\n<think>`` (no assistant marker).
- System messages are gathered at the top: appends are ``tool``, ``user``, ``assistant``.
- Thinking per request with ``thinking`` (default off).
- Tokenizer: not available offline: a stand-in with DeepSeek's special tokens.
"""

from __future__ import annotations

from tito.parse.deepseek import DsmlParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = None
EOS = "<｜end▁of▁sentence｜>"
BOS = "<｜begin▁of▁sentence｜>"
STANDIN = (BOS, EOS, "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>")
STANDIN_EOS = EOS


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="deepseek_v32",
        template=template or bundled_template("deepseek_v32.jinja"),
        pinned_kwargs={"drop_thinking": False},
        allowed_append_roles=frozenset({"tool", "user", "assistant"}),
        assistant_start="<｜Assistant｜>",
        stop_tokens=(EOS,),
        bos_token=BOS,
        eos_token=EOS,
        thinking_kwarg="thinking",
        thinking_default=False,
        turn_openers=("<｜User｜>", "<｜Assistant｜>", "<function_results>",
                      "</function_results>"),
        assistant_openers=("<｜Assistant｜>", "</function_results>"),
    )
    parser = DsmlParser(tokenizer, stop_texts=(EOS,), think_opened_by_prompt=True,
                        block="function_calls")
    return TemplateRenderer(tokenizer, spec, parser)
