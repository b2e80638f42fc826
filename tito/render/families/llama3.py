"""``llama3``: Llama 3.1 / 3.2 / 3.3 Instruct (JSON tool calls, ``ipython`` tool role).

- Template: the publisher's 3.1 layout, corrected to render parallel calls and the content
  of tool-calling turns (upstream raises / drops them). Tools go into the first user turn
  (``tools_in_user_message``, upstream default), so the bridge base carries a dummy user.
- Junction: concatenation after ``<|eot_id|>``. All roles append. No reasoning.
- Calls: ``{"name": N, "parameters": {...}}``, several joined by ``; ``.
- Tokenizer: the Llama 3 tokenizer.json (3.0 names; ``<|eom_id|>`` is used when present).
"""

from __future__ import annotations

from tito.parse.llama3 import Llama3JsonParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.families import bundled_template
from tito.types.tokenizer import Tokenizer

FIXTURE = "llama-3.1"


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    stops = tuple(t for t in ("<|eot_id|>", "<|eom_id|>") if tokenizer.token_to_id(t) is not None)
    spec = FamilySpec(
        name="llama3",
        template=template or bundled_template("llama3.jinja"),
        assistant_start="<|start_header_id|>assistant",
        stop_tokens=stops,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        reasoning=False,
        bridge_base_user=True,
        turn_openers=("<|start_header_id|>",),
    )
    parser = Llama3JsonParser(tokenizer, stop_texts=stops, think_start=None, think_end=None)
    return TemplateRenderer(tokenizer, spec, parser)
