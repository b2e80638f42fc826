"""Renderers over real tokenizers: bridges reproduce the canonical render bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tito.parse.hermes import HermesParser
from tito.render import FamilySpec, TemplateRenderer, build_renderer
from tito.render.compare import count_by_type, mismatch_report
from tito.render.verify import trajectory_pool, verify_renderer
from tito.types.errors import BadRequest, ConfigError, TokenizationError
from tito.types.tokenizer import load_tokenizer

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def qwen3(qwen3_dir: Path) -> TemplateRenderer:
    return build_renderer("qwen3", qwen3_dir)


@pytest.fixture(scope="module")
def chatml(smollm2_dir: Path) -> TemplateRenderer:
    return build_renderer("chatml", smollm2_dir)


def test_qwen3_junction_appends_newline_after_im_end(qwen3: TemplateRenderer) -> None:
    assistant = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    completion = qwen3.render_completion(assistant, tools=TOOLS)
    assert completion[-1] == qwen3.tokenizer.require_id("<|im_end|>")
    bridge = qwen3.bridge(assistant, completion[-1],
                          [{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
                          tools=TOOLS)
    text = qwen3.tokenizer.decode(bridge.ids)
    assert bridge.drop == 0
    assert text.startswith("\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>")
    assert text.endswith("<|im_start|>assistant\n")
    assert text.count("<|im_start|>assistant") == 1  # generation prompt exactly once


def test_bridge_closes_a_turn_cut_by_length(qwen3: TemplateRenderer) -> None:
    last_content_id = qwen3.tokenizer.encode("Hello")[-1]
    bridge = qwen3.bridge({"role": "assistant", "content": "Hello"}, last_content_id,
                          [{"role": "user", "content": "go on"}])
    assert qwen3.tokenizer.decode(bridge.ids).startswith("<|im_end|>\n<|im_start|>user\ngo on")


def test_thinking_off_prompt_and_history(qwen3: TemplateRenderer) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    on = qwen3.tokenizer.decode(qwen3.render_prompt(msgs))
    off = qwen3.tokenizer.decode(
        qwen3.render_prompt(msgs, template_kwargs={"enable_thinking": False}))
    assert on.endswith("<|im_start|>assistant\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_pinned_kwarg_conflict_is_400(qwen3: TemplateRenderer) -> None:
    with pytest.raises(BadRequest, match="clear_thinking"):
        qwen3.render_prompt([{"role": "user", "content": "x"}],
                            template_kwargs={"clear_thinking": True})


@pytest.mark.parametrize("family,folder", [("qwen3", "qwen3"), ("chatml", "smollm2")])
def test_families_pass_the_verifier(family: str, folder: str, request: pytest.FixtureRequest
                                    ) -> None:
    directory = request.getfixturevalue(f"{folder}_dir")
    report = verify_renderer(build_renderer(family, directory))
    failures = [c for c in report.cases if not c.passed]
    assert report.passed, failures[:3]
    assert len(report.cases) >= 18


def test_original_qwen3_template_fails_the_verifier(qwen3_dir: Path) -> None:
    """The shipped Qwen3 template drops history <think>: the verifier must catch it."""
    report = verify_renderer(build_renderer("default", qwen3_dir))
    assert not report.passed
    assert any(c.check == "token_prefix" and "divergence" in c.detail for c in report.cases)


def test_disallowed_append_role_names_family(qwen3_dir: Path) -> None:
    tok = load_tokenizer(qwen3_dir)
    base = build_renderer("qwen3", qwen3_dir)
    spec = FamilySpec(name="toolonly", template=base.template, stop_tokens=("<|im_end|>",),
                      allowed_append_roles=frozenset({"tool"}))
    renderer = TemplateRenderer(tok, spec, HermesParser(tok))
    with pytest.raises(BadRequest, match=r"family 'toolonly' cannot append .* role 'user'"):
        renderer.bridge({"role": "assistant", "content": "x"}, None,
                        [{"role": "user", "content": "y"}])


def test_non_append_only_template_is_rejected(qwen3_dir: Path) -> None:
    tok = load_tokenizer(qwen3_dir)
    # A template that prints the message count first cannot be bridged.
    template = "{{ messages|length }}{% for m in messages %}<|im_start|>{{ m.role }}\n" \
               "{{ m.content }}<|im_end|>\n{% endfor %}"
    renderer = TemplateRenderer(tok, FamilySpec(name="default", template=template,
                                                stop_tokens=("<|im_end|>",)), HermesParser(tok))
    with pytest.raises(TokenizationError, match="append-only"):
        renderer.bridge({"role": "assistant", "content": "x"}, None,
                        [{"role": "user", "content": "y"}])


def test_chat_template_only_with_default(qwen3_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages }}")
    with pytest.raises(ConfigError, match="only allowed with family 'default'"):
        build_renderer("qwen3", qwen3_dir, chat_template=path)
    with pytest.raises(ConfigError, match="unknown family"):
        build_renderer("nope", qwen3_dir)


def test_mismatch_report_is_clean_for_generated_trajectory(qwen3: TemplateRenderer) -> None:
    _name, messages, tools = trajectory_pool()[0]
    ids = qwen3.render_prompt(messages[:2], tools=tools)
    ids += qwen3.render_completion(messages[2], tools=tools)
    report = mismatch_report(qwen3, messages[:3], ids, tools=tools)
    assert report == []
    # Corrupt one non-assistant token: a strict mismatch class appears.
    bad = list(ids)
    bad[5] = qwen3.tokenizer.encode("zebra")[0]
    counts = count_by_type(mismatch_report(qwen3, messages[:3], bad, tools=tools))
    assert counts["non_assistant_text"] == 1


def test_chatml_renders_tools_smollm2_template_ignores(chatml: TemplateRenderer) -> None:
    text = chatml.tokenizer.decode(chatml.render_prompt(
        [{"role": "user", "content": "hi"}], tools=TOOLS))
    assert "<tools>" in text and "get_weather" in text
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
