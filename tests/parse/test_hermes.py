"""Hermes/Qwen3 completion parsing on real token ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tito.render import TemplateRenderer, build_renderer


@pytest.fixture(scope="module")
def qwen3(qwen3_dir: Path) -> TemplateRenderer:
    return build_renderer("qwen3", qwen3_dir)


def ids(r: TemplateRenderer, text: str) -> list[int]:
    return r.tokenizer.encode(text)


def test_reasoning_content_and_two_calls(qwen3: TemplateRenderer) -> None:
    text = ('<think>\nplan\n</think>\n\nChecking.\n<tool_call>\n{"name": "a", "arguments": '
            '{"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {"y": "é"}}\n'
            '</tool_call><|im_end|>')
    parsed = qwen3.parse(ids(qwen3, text), "stop")
    assert parsed.reasoning_content == "plan"
    assert parsed.content == "Checking."
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["a", "b"]
    assert json.loads(parsed.tool_calls[1]["function"]["arguments"]) == {"y": "é"}
    assert all(c["id"].startswith("call_") and c["type"] == "function"
               for c in parsed.tool_calls)
    assert parsed.finish_reason == "tool_calls"


def test_malformed_call_stays_in_content(qwen3: TemplateRenderer) -> None:
    text = 'Oops <tool_call>\n{"name": "a", "arguments": {oops}\n</tool_call><|im_end|>'
    parsed = qwen3.parse(ids(qwen3, text), "stop")
    assert parsed.tool_calls == []
    assert "<tool_call>" in parsed.content and "{oops}" in parsed.content
    assert parsed.finish_reason == "stop"


def test_mixed_valid_and_malformed_calls(qwen3: TemplateRenderer) -> None:
    text = ('<tool_call>\n{"name": "ok", "arguments": {}}\n</tool_call>\n'
            '<tool_call>\nnot json\n</tool_call><|im_end|>')
    parsed = qwen3.parse(ids(qwen3, text), "stop")
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["ok"]
    assert "not json" in parsed.content


def test_length_wins_over_tool_calls(qwen3: TemplateRenderer) -> None:
    text = '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"na'
    parsed = qwen3.parse(ids(qwen3, text), "length")
    assert parsed.finish_reason == "length"
    assert len(parsed.tool_calls) == 1
    assert parsed.content.startswith("<tool_call>")  # the cut call is kept as content


def test_reasoning_cut_by_length(qwen3: TemplateRenderer) -> None:
    parsed = qwen3.parse(ids(qwen3, "<think>\nstill thinking"), "length")
    assert parsed.reasoning_content == "still thinking"
    assert parsed.content == ""
    assert parsed.finish_reason == "length"


def test_plain_text_and_abort(qwen3: TemplateRenderer) -> None:
    parsed = qwen3.parse(ids(qwen3, "Hello there.<|im_end|>"), "stop")
    assert (parsed.content, parsed.reasoning_content, parsed.tool_calls) == \
        ("Hello there.", None, [])
    assert qwen3.parse(ids(qwen3, "Hel"), "abort").finish_reason == "abort"


def test_arguments_given_as_json_string(qwen3: TemplateRenderer) -> None:
    text = '<tool_call>\n{"name": "a", "arguments": "{\\"k\\": [1, 2]}"}\n</tool_call><|im_end|>'
    parsed = qwen3.parse(ids(qwen3, text), "stop")
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"k": [1, 2]}
