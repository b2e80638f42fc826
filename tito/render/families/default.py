"""``default``: any Hugging Face chat template, best effort (verified at startup)."""

from __future__ import annotations

from tito.parse.hermes import HermesParser
from tito.render.base import FamilySpec, TemplateRenderer
from tito.types.tokenizer import Tokenizer


def build(tokenizer: Tokenizer, template: str | None) -> TemplateRenderer:
    spec = FamilySpec(name="default", template=template)
    return TemplateRenderer(tokenizer, spec, HermesParser(tokenizer))
