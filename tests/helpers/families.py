"""A renderer of each family, on its fixture tokenizer (or its stand-in), for tests that
run every family (skeletons, bridge stand-ins)."""

from __future__ import annotations

import functools

import pytest

from helpers.support import TOKENIZERS
from tito.render import TemplateRenderer, build_renderer
from tito.render.families import STANDIN, family_module

FOLDERS = {"chatml": "smollm2", "default": "qwen3", "qwen3": "qwen3"}
"""Fixture folders of the families whose module names none."""


@functools.cache
def renderer_of(family: str) -> TemplateRenderer:
    module = family_module(family)
    folder = getattr(module, "FIXTURE", None) or FOLDERS.get(family)
    if folder is None and hasattr(module, "STANDIN"):
        return build_renderer(family, STANDIN)
    assert folder is not None, family
    path = TOKENIZERS / folder
    if not path.is_dir():
        pytest.skip(f"needs ../shared/fixtures/tokenizers/{folder} (absent: {path})")
    return build_renderer(family, path)
