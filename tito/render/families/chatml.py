"""``chatml`` / ``smollm2``: ChatML with Hermes-style tool calls (the embedded model's family).

SmolLM2's own template ignores ``tools``; ours renders them in the system turn, assistant
tool calls as ``<tool_call>{json}</tool_call>``, and tool results as ``<tool_response>``
user turns. Junction: ``<|im_end|>`` is followed by ``\\n`` in the render, the model stops
at ``<|im_end|>``, so the bridge starts with ``\\n``.
"""

from __future__ import annotations

from tito.parse.hermes import HermesParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(
        name="chatml",
        template=template or bundled_template("chatml_tools.jinja"),
        assistant_start="<|im_start|>assistant",
        stop_tokens=("<|im_end|>",),
    )
    return TemplateRenderer(tokenizer, spec, HermesParser(tokenizer))
