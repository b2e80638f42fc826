"""``glm47``: GLM-4.5 / 4.6 / 4.7 (GLM-5 / 5.1 with their own template: ``glm5``).

- Template: GLM-4.7's, corrected: with ``clear_thinking=False`` (pinned) and thinking on,
  every assistant renders ``<think>R</think>`` (append-only for every role).
- Junction: the model stops at ``<|observation|>`` (after tool calls) or ``<|user|>``, and
  those tokens also *open* the next message. The stored stop id is dropped and the bridge
  renders the real opener (declared trailing trim: 1 token), also when they differ (a failed
  tool call followed by a user message).
- Calls: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>``.
- Tokenizer: not available offline: a stand-in with GLM's special tokens.
"""

from __future__ import annotations

from typing import Any

from tito.parse.glm import GlmParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = None
STOPS = ("<|user|>", "<|observation|>", "<|endoftext|>")
STANDIN = ("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
           "<|user|>", "<|assistant|>", "<|observation|>", "<think>", "</think>",
           "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
           "</arg_value>", "<tool_response>", "</tool_response>")
STANDIN_EOS = "<|user|>"


class GlmRenderer(TemplateRenderer):
    def completion_stop_text(self, message: dict[str, Any]) -> str:
        return "<|observation|>" if message.get("tool_calls") else "<|user|>"


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="glm47",
        template=template or bundled_template("glm47.jinja"),
        pinned_kwargs={"clear_thinking": False},
        assistant_start="<|assistant|>",
        stop_tokens=STOPS,
        thinking_kwarg="enable_thinking",
        max_trailing_trim=1,
        trailing_tokens=("<|user|>", "<|observation|>"),
        turn_openers=("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
    )
    parser = GlmParser(tokenizer, stop_texts=STOPS, think_opened_by_prompt=True)
    return GlmRenderer(tokenizer, spec, parser)
