"""Model families, one module each, and the registry that builds their renderers.

Each module exposes ``build(tokenizer, template) -> TemplateRenderer`` and ``FIXTURE`` (the
fixture tokenizer folder it is verified with, or None). Families whose tokenizer is not
available offline (and a few with one, e.g. ``qwen38``) also expose ``STANDIN`` (their special
tokens) and ``STANDIN_EOS``: pass ``"standin"`` as the tokenizer to build them over a
documented stand-in tokenizer.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from tito.render.base import TemplateRenderer
from tito.types.errors import ConfigError
from tito.types.tokenizer import Tokenizer

# family name -> module under tito.render.families exposing ``build(tokenizer, template)``
FAMILIES: dict[str, str] = {
    "default": "default",
    "chatml": "chatml",
    "smollm2": "chatml",
    "qwen3": "qwen3",
    "qwen3_thinking": "qwen3_thinking",
    "qwennext": "qwen3_thinking",
    "qwen35": "qwen35",
    "qwen36": "qwen36",
    "qwen38": "qwen38",
    "glm47": "glm47",
    "glm5": "glm5",
    "deepseek_v31": "deepseek_v31",
    "deepseek_v32": "deepseek_v32",
    "deepseekv32": "deepseek_v32",
    "deepseek_v4": "deepseek_v4",
    "deepseekv4": "deepseek_v4",
    "deepseek_v41": "deepseek_v41",
    "kimi_k2": "kimi_k2",
    "kimi_k25": "kimi_k25",
    "kimi_k3": "kimi_k3",
    "minimax_m2": "minimax_m2",
    "minimax_m25": "minimax_m25",
    "minimax_m3": "minimax_m3",
    "gemma4": "gemma4",
    "nemotron3": "nemotron3",
    "nemotron35": "nemotron35",
    "llama3": "llama3",
    "gpt_oss": "gpt_oss",
    "mistral": "mistral",
    "inkling": "inkling",
}
ALIASES = {"smollm2": "chatml", "qwennext": "qwen3_thinking", "deepseekv32": "deepseek_v32",
           "deepseekv4": "deepseek_v4"}
"""Alternative names (design §4.3 spells some families without the underscore)."""

STANDIN = "standin"
TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"


def bundled_template(name: str) -> str:
    return (TEMPLATES_DIR / name).read_text()


def family_module(family: str) -> ModuleType:
    if family not in FAMILIES:
        raise ConfigError(f"unknown family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    return importlib.import_module(f"tito.render.families.{FAMILIES[family]}")


def standin_for(family: str) -> Tokenizer:
    """The documented stand-in tokenizer of a family without an offline tokenizer."""
    from tito.render.families.loaders import standin_tokenizer

    module = family_module(family)
    specials = getattr(module, "STANDIN", None)
    if specials is None:
        raise ConfigError(f"family {family!r} has a real tokenizer; it has no stand-in")
    return standin_tokenizer(FAMILIES[family], specials, module.STANDIN_EOS)


def build_renderer(
    family: str, tokenizer: Tokenizer | str | Path, *, chat_template: str | Path | None = None,
    stop_token: str | None = None,
) -> TemplateRenderer:
    """The renderer of ``family`` over ``tokenizer`` (a :class:`Tokenizer`, a folder, or
    ``"standin"`` for a family's documented stand-in); ``stop_token``: the end-of-turn
    token of a ``default`` template (else the template's own marker)."""
    module = family_module(family)
    if chat_template is not None and family != "default":
        raise ConfigError(
            f"--chat-template is only allowed with family 'default' (family {family!r} "
            "brings its own append-only template)"
        )
    if stop_token is not None and family != "default":
        raise ConfigError(f"--stop-token is only allowed with family 'default' (family "
                          f"{family!r} declares its own stop tokens)")
    if isinstance(tokenizer, str) and tokenizer == STANDIN:
        tokenizer = standin_for(family)
    elif not isinstance(tokenizer, Tokenizer):
        from tito.render.families.loaders import load_any

        tokenizer = load_any(tokenizer)
    template = Path(chat_template).read_text() if chat_template is not None else None
    if stop_token is not None:
        return module.build(tokenizer, template, stop_token)
    return module.build(tokenizer, template)
