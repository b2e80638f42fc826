"""Model families, one module each, and the registry that builds their renderers."""

from __future__ import annotations

import importlib
from pathlib import Path

from tito.errors import BadRequest
from tito.render.base import TemplateRenderer
from tito.render.tokenizer import Tokenizer, load_tokenizer

# family name -> module under tito.render.families exposing ``build(tokenizer, template)``
FAMILIES: dict[str, str] = {
    "default": "default",
    "chatml": "chatml",
    "smollm2": "chatml",
    "qwen3": "qwen3",
}

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"


def bundled_template(name: str) -> str:
    return (TEMPLATES_DIR / name).read_text()


def build_renderer(
    family: str, tokenizer: Tokenizer | str | Path, *, chat_template: str | Path | None = None
) -> TemplateRenderer:
    """The renderer of ``family`` over ``tokenizer`` (a :class:`Tokenizer` or a folder)."""
    if family not in FAMILIES:
        raise BadRequest(f"unknown family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    if chat_template is not None and family != "default":
        raise BadRequest(
            f"--chat-template is only allowed with family 'default' (family {family!r} "
            "brings its own append-only template)"
        )
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    template = Path(chat_template).read_text() if chat_template is not None else None
    module = importlib.import_module(f"tito.render.families.{FAMILIES[family]}")
    return module.build(tokenizer, template)
