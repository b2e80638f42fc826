"""``glm5``: GLM-5 / GLM-5.1 (GLM-4.7's markers and junction; its own template).

- Template: GLM-5.1's as miles patched it (bundled unchanged; the publisher's own file was
  not available offline). Tools are unwrapped from ``{"type": "function", ...}`` and
  written without ``strict``/``defer_loading``; a tool with ``defer_loading`` is not
  rendered.
- Pinned: ``clear_thinking=False``. Upstream clears history reasoning (only turns after the
  last user message keep ``<think>R</think>``); pinned, every assistant keeps it, so renders
  are append-only. A request asking ``clear_thinking=True`` is a 400
  (``template_kwarg_conflict``).
- Thinking per request (``enable_thinking``; OpenAI effort ``none``/``minimal`` off, other
  efforts on; Anthropic ``thinking``): prompt ``<think>`` or ``</think>``. History
  reasoning renders in both modes, so a session may switch it between turns with no
  mismatch.
- Junction: glm47's. The model stops at ``<|observation|>`` (after tool calls) or ``<|user|>``,
  and those tokens also *open* the next message: the stored stop id is dropped and the bridge
  renders the real opener (declared trailing trim: 1 token). All roles append.
- Reasoning renders unstripped: the parser keeps it exactly (``exact_reasoning``); content
  renders stripped, as the parser returns it.
- Calls: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>``.
- Tokenizer: not available offline: glm47's stand-in (GLM's special tokens).
"""

from __future__ import annotations

from tito.parse.glm import GlmParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.render.families.glm47 import STANDIN, STANDIN_EOS, STOPS, GlmRenderer
from tito.types.tokenizer import Tokenizer

__all__ = ["FIXTURE", "STANDIN", "STANDIN_EOS", "STOPS", "build"]

FIXTURE = None
TEMPLATE_FIXTURE = ("glm-5.x", "chat_template_glm-5.1_miles-patched.jinja")
"""The fixture template the bundled one is a copy of (checked by the tests)."""


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="glm5",
        template=template or bundled_template("glm5.jinja"),
        pinned_kwargs={"clear_thinking": False},
        assistant_start="<|assistant|>",
        stop_tokens=STOPS,
        thinking_kwarg="enable_thinking",
        max_trailing_trim=1,
        trailing_tokens=("<|user|>", "<|observation|>"),
        turn_openers=("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
    )
    parser = GlmParser(tokenizer, stop_texts=STOPS, think_opened_by_prompt=True,
                       exact_reasoning=True)
    return GlmRenderer(tokenizer, spec, parser)
