"""``TemplateRenderer.render_options``: the thinking switch is one of a session's render
options exactly where the family's template writes it before the generation prompt (a
render of a system and a user message, thinking on and off, under every effort level)."""

from __future__ import annotations

import pytest
from helpers.support import tokenizer_dir

from tito.render import build_renderer
from tito.render.base import TemplateRenderer
from tito.render.families import ALIASES, FAMILIES, family_module

pytestmark = pytest.mark.slow  # every family's template at every effort

PROBE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
SWITCHED = [f for f in FAMILIES if f not in ALIASES and f != "default"]


def _renderer(family: str) -> TemplateRenderer:
    module = family_module(family)
    if getattr(module, "STANDIN", None) is not None:
        return build_renderer(family, "standin")
    folder = getattr(module, "FIXTURE", None) or {"chatml": "smollm2"}.get(family, family)
    return build_renderer(family, tokenizer_dir(folder))


@pytest.mark.parametrize("family", SWITCHED)
def test_thinking_in_prefix_matches_the_template(family: str) -> None:
    renderer = _renderer(family)
    kwarg = renderer.spec.thinking_kwarg
    if kwarg is None:
        pytest.skip(f"{family} has no thinking switch")
    for effort in (None, "low", "medium", "high", "xhigh"):
        options = {} if effort is None else {
            k: v for k, v in renderer.effort_kwargs(effort).items() if k != kwarg}
        on, off = (renderer.render_text(PROBE, template_kwargs=renderer.effective_kwargs(
            {**options, **renderer.thinking_switch_kwargs(flag)})) for flag in (True, False))
        assert (on != off) == renderer.thinking_in_prefix(renderer.render_options(options)), \
            (family, effort)


def test_every_effort_that_thinks_sets_a_level() -> None:
    """A family with a level kwarg maps every effort that turns thinking on to a level, so
    that a session tells an explicit effort from none (deepseek_v4: ``low`` -> ``high``)."""
    for family in ("deepseek_v41", "kimi_k3", "qwen38", "inkling"):
        renderer = _renderer(family)
        level = renderer.spec.effort_kwarg
        assert level is not None
        for effort in ("low", "medium", "high", "xhigh"):
            assert level in renderer.effort_kwargs(effort), (family, effort)
