"""``default``: any Hugging Face chat template, best effort (verified at startup).

The template declares what a family spec would: its thinking switch (the first of
``enable_thinking``/``thinking`` that changes the generation prompt) and its end-of-turn
marker (the special token after an assistant's content), the first stop token unless
``stop_token`` names one; the tokenizer's EOS stops too.
"""

from __future__ import annotations

from tito.parse.hermes import HermesParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.render.probe import end_marker, thinking_switch
from tito.types.errors import BadRequest
from tito.types.tokenizer import Tokenizer


def build(tokenizer: Tokenizer, template: str | None,
          stop_token: str | None = None) -> TemplateRenderer:
    source = template or tokenizer.chat_template
    if not source:
        raise BadRequest(f"tokenizer {tokenizer.name!r} has no chat template; pass one")
    special = {"bos_token": None, "eos_token": tokenizer.eos_token}
    if stop_token is not None and tokenizer.token_to_id(stop_token) is None:
        raise BadRequest(f"stop token {stop_token!r} is not a token of {tokenizer.name!r}")
    first = stop_token or end_marker(source, tokenizer, special)
    stops = tuple(dict.fromkeys(t for t in (first, tokenizer.eos_token) if t))
    kwarg, default = thinking_switch(source, special)
    spec = FamilySpec(name="default", template=template, stop_tokens=stops,
                      thinking_kwarg=kwarg, thinking_default=default)
    return TemplateRenderer(tokenizer, spec, HermesParser(tokenizer))
