"""``deepseek_v31``: DeepSeek-V3.1 (and V3 / R1-0528 tool format).

- Template: ours, after the publisher's: history reasoning renders (``<think>R</think>``
  with thinking on, ``<think></think>`` off) instead of being dropped. After tool outputs the
  model continues without an assistant marker, as upstream.
- System messages are gathered at the top of the prompt, so a system append would change
  history: the family appends ``tool``, ``user`` and ``assistant`` only.
- Thinking per request with ``thinking`` (default off, as upstream).
- Calls: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>JSON<｜tool▁call▁end｜>…``.
- Tokenizer: DeepSeek-V3's tokenizer.json (same vocabulary; ``<think>`` is not one token).
"""

from __future__ import annotations

from tito.parse.deepseek import DeepSeekV31Parser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = "deepseek-v3.1"
EOS = "<｜end▁of▁sentence｜>"
BOS = "<｜begin▁of▁sentence｜>"


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="deepseek_v31",
        template=template or bundled_template("deepseek_v31.jinja"),
        allowed_append_roles=frozenset({"tool", "user", "assistant"}),
        assistant_start="<｜Assistant｜>",
        stop_tokens=(EOS,),
        bos_token=BOS,
        eos_token=EOS,
        thinking_kwarg="thinking",
        thinking_default=False,
        turn_openers=("<｜User｜>", "<｜Assistant｜>", "<｜tool▁output▁begin｜>",
                      "<｜tool▁output▁end｜>"),
        assistant_openers=("<｜Assistant｜>", "<｜tool▁output▁end｜>"),
    )
    parser = DeepSeekV31Parser(tokenizer, stop_texts=(EOS,), think_opened_by_prompt=True)
    return TemplateRenderer(tokenizer, spec, parser)
