"""Rendering messages to token ids (pure: no I/O beyond loading tokenizer files)."""

from tito.render.base import Bridge, FamilySpec, TemplateRenderer
from tito.render.families import FAMILIES, build_renderer
from tito.render.tokenizer import Tokenizer, load_tokenizer

__all__ = ["FAMILIES", "Bridge", "FamilySpec", "TemplateRenderer", "Tokenizer",
           "build_renderer", "load_tokenizer"]
