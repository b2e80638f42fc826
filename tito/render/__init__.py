"""Rendering messages to token ids (design §4): renderers, families, the append-only verifier."""

from tito.render.base import Bridge, FamilySpec, TemplateRenderer
from tito.render.families import FAMILIES, build_renderer

__all__ = ["FAMILIES", "Bridge", "FamilySpec", "TemplateRenderer", "build_renderer"]
