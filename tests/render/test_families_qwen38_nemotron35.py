"""Qwen3.8, Qwen3.6 and Nemotron 3.5: the bundled templates are the publisher's (one marked
fix for Nemotron 3.5), the published defaults are not append-only while the pinned options
are, a request cannot contradict a pin, and Qwen3.8's reasoning effort (its system
instruction) maps from OpenAI's efforts and stays append-only."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers.support import TOKENIZERS

from tito.cli import verify_template as verify_cli
from tito.render import TemplateRenderer, build_renderer
from tito.render.families import TEMPLATES_DIR, family_module
from tito.render.verify import verify_renderer
from tito.types.errors import BadRequest, TokenizationError

NEW = ["qwen38", "qwen36", "nemotron35"]
USER = [{"role": "user", "content": "hi"}]


def fixture_template(family: str) -> str:
    path = TOKENIZERS / family_module(family).TEMPLATE_FIXTURE
    if not path.is_file():
        pytest.skip(f"needs the fixture template {path} (../shared is absent)")
    return path.read_text()


def bundled(family: str) -> list[str]:
    """The bundled template less its first line (our provenance comment)."""
    first, rest = (TEMPLATES_DIR / f"{family}.jinja").read_text().split("\n", 1)
    assert first.startswith("{#-") and first.endswith("-#}")
    return rest.split("\n")


@pytest.mark.parametrize("family", ["qwen38", "qwen36"])
def test_bundled_qwen_template_is_the_publishers(family: str) -> None:
    assert "\n".join(bundled(family)) == fixture_template(family)


def test_nemotron35_template_differs_only_by_the_marked_fix() -> None:
    lines = bundled("nemotron35")
    at = next(i for i, line in enumerate(lines) if "TITO fix" in line)
    assert lines[at - 1].strip() == "{%- elif enable_thinking %}"
    assert "<think>\\n</think>" in lines[at + 1]
    assert "\n".join(lines[: at - 1] + lines[at + 2:]) == fixture_template("nemotron35")


@pytest.mark.parametrize("family", NEW)
def test_standin_passes_the_verifier_from_the_cli(family: str,
                                                  capsys: pytest.CaptureFixture) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    verify_cli.add_arguments(parser)
    rc = verify_cli.run(parser.parse_args(["--tokenizer", "standin", "--family", family,
                                           "--json"]))
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["passed"], report
    assert report["checks"]["token_prefix"][0] == report["checks"]["token_prefix"][1] > 0


def published(family: str) -> TemplateRenderer:
    """The family over its stand-in with the publisher's template and no pinned kwargs."""
    r = build_renderer(family, "standin")
    spec = dataclasses.replace(r.spec, template=fixture_template(family), pinned_kwargs={})
    return TemplateRenderer(r.tokenizer, spec, r.parser)


@pytest.mark.parametrize("family,kwargs", [("qwen36", {}),
                                           ("qwen38", {"preserve_thinking": False}),
                                           ("nemotron35", {})])
def test_published_defaults_drop_history_reasoning(family: str, kwargs: dict) -> None:
    report = verify_renderer(published(family), thinking="on", kwargs=kwargs)
    assert not report.passed
    broken = [c for c in report.cases if c.check == "text_prefix" and not c.passed]
    assert broken and "think" in broken[0].detail


def test_published_qwen38_defaults_are_append_only() -> None:
    assert verify_renderer(published("qwen38")).passed


@pytest.mark.parametrize("family,kwarg", [("qwen38", {"preserve_thinking": False}),
                                          ("qwen36", {"preserve_thinking": False}),
                                          ("nemotron35", {"truncate_history_thinking": True})])
def test_a_request_cannot_contradict_the_pin(family: str, kwarg: dict) -> None:
    r = build_renderer(family, "standin")
    assert r.capability_report()["pinned_kwargs"] == {k: not v for k, v in kwarg.items()}
    with pytest.raises(BadRequest) as err:
        r.render_prompt(USER, template_kwargs=kwarg)
    assert err.value.code == "template_kwarg_conflict" and family in err.value.message


def test_qwen38_effort_levels_and_instruction() -> None:
    r = build_renderer("qwen38", "standin")
    assert r.effort_kwargs("none") == r.effort_kwargs("minimal") == {"enable_thinking": False}
    assert r.effort_kwargs("low") == {"enable_thinking": True, "reasoning_effort": "low"}
    assert r.effort_kwargs("medium") == {"enable_thinking": True, "reasoning_effort": "medium"}
    assert r.effort_kwargs("high") == r.effort_kwargs("xhigh") == {
        "enable_thinking": True, "reasoning_effort": "xhigh"}

    def prompt(kwargs: dict) -> str:
        return r.tokenizer.decode(r.render_prompt(USER, template_kwargs=kwargs))

    assert prompt({}).startswith("<|im_start|>system\nReasoning effort is set to xhigh.")
    assert prompt(r.effort_kwargs("low")).startswith(
        "<|im_start|>system\nReasoning effort is set to low.")
    assert prompt(r.effort_kwargs("medium")).startswith("<|im_start|>user\nhi")
    assert prompt(r.effort_kwargs("none")).startswith("<|im_start|>user\nhi")
    assert prompt(r.effort_kwargs("none")).endswith("<think>\n\n</think>\n\n")
    with pytest.raises(TokenizationError, match="Unexpected reasoning effort"):
        r.render_prompt(USER, template_kwargs={"reasoning_effort": "high"})


@pytest.mark.parametrize("level", ["low", "medium"])
def test_qwen38_effort_levels_stay_append_only(level: str) -> None:
    report = verify_renderer(build_renderer("qwen38", "standin"), thinking="on",
                             kwargs={"reasoning_effort": level})
    assert report.passed, [c for c in report.cases if not c.passed][:2]


def test_nemotron35_renders_booleans_the_python_way() -> None:
    """The template writes ``True`` (``| string``), which its parser reads back as a
    boolean; Qwen3.8/3.6 write JSON (``true``)."""
    message = {"role": "assistant", "content": "", "tool_calls": [{
        "id": "c", "type": "function",
        "function": {"name": "f", "arguments": json.dumps({"b": True, "n": 3})}}]}
    for family, want in [("nemotron35", True), ("qwen38", True), ("qwen36", True)]:
        r = build_renderer(family, "standin")
        parsed = r.parse(r.render_completion(message), "stop")
        assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"b": want, "n": 3}
