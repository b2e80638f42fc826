"""Typed reasons of a divergence (tito.types.mismatch.REASONS), each constructed from a real
tokenizer and a real family render, and the reasons in the verifier's and the session
comparator's reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.support import tokenizer_dir

from tito.render import build_renderer
from tito.render.base import TemplateRenderer
from tito.render.compare import TurnSpan, mismatch_report
from tito.render.divergence import hints_for, id_divergence, text_divergence
from tito.render.verify import verify_renderer
from tito.types.errors import TokenizationError
from tito.types.mismatch import REASONS

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "metric": {"type": "boolean"}}}}}
ARGS = {"city": "Paris", "days": 2, "metric": True}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
     "tool_calls": [{"id": "c1", "type": "function", "function": {
         "name": "get_weather", "arguments": json.dumps(ARGS)}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21"},
    {"role": "assistant", "content": "It is 21.", "reasoning_content": "Done."},
    {"role": "user", "content": "Thanks!"},
]


@pytest.fixture(scope="module")
def qwen3() -> TemplateRenderer:
    return build_renderer("qwen3", tokenizer_dir("qwen3"))


def _text(renderer: TemplateRenderer) -> str:
    return renderer.render_text(CONVERSATION, tools=[TOOL], add_generation_prompt=True)


def _reason(renderer: TemplateRenderer, expected: str, actual: str, **hints: Any) -> str:
    tok = renderer.tokenizer
    div = id_divergence(tok, tok.encode(expected), tok.encode(actual),
                        hints_for(renderer, CONVERSATION, **hints))
    assert div is not None and div.reason in REASONS
    return div.reason


@pytest.mark.parametrize(("old", "new", "reason"), [
    ('"days": 2', '"days": 2.0', "value_reserialized"),
    ('"metric": true', '"metric": True', "value_reserialized"),
    ('"city": "Paris"', '"city":"Paris"', "tool_call_rerendered"),
    ("Thanks!", "Thanks?", "text_differs"),
    ("<think>\nCall the tool.\n</think>", "", "reasoning_dropped"),
])
def test_text_reasons(qwen3: TemplateRenderer, old: str, new: str, reason: str) -> None:
    expected = _text(qwen3)
    assert old in expected
    actual = expected.replace(old, new)
    if reason == "reasoning_dropped":  # the later render is the one without it
        expected, actual = actual, expected
    assert _reason(qwen3, expected, actual) == reason


def test_closing_reasons(qwen3: TemplateRenderer) -> None:
    tok = qwen3.tokenizer
    expected = tok.encode(_text(qwen3))
    end, other = tok.require_id("<|im_end|>"), tok.require_id("<|endoftext|>")
    k = expected.index(end, expected.index(tok.require_id("<|im_start|>"), 5) + 1)
    hints = hints_for(qwen3, CONVERSATION)
    cut = id_divergence(tok, expected, expected[:k] + expected[k + 1 :], hints)
    assert cut is not None and cut.reason == "truncated_without_close"
    assert (cut.token_index, cut.expected_id, cut.expected_token) == (k, end, "<|im_end|>")
    swapped = id_divergence(tok, expected, [*expected[:k], other, *expected[k + 1 :]], hints)
    assert swapped is not None and swapped.reason == "unknown_closing_sequence"
    assert swapped.actual_id == other
    opener = tok.require_id("<|im_start|>")
    j = expected.index(opener, 1)
    marker = tok.require_id("<|object_ref_start|>")
    special = id_divergence(tok, expected, [*expected[:j], marker, *expected[j + 1 :]], hints)
    assert special is not None and special.reason == "special_token_differs"


def test_same_text_other_ids(qwen3: TemplateRenderer) -> None:
    tok = qwen3.tokenizer
    held, bridge = tok.encode("Hello\n"), tok.encode("\nWorld")
    canonical = tok.encode("Hello\n\nWorld")
    assert canonical != held + bridge  # a fresh tokenization merges "\n\n"
    hints = hints_for(qwen3, CONVERSATION, junctions=(len(held),))
    merged = id_divergence(tok, canonical, held + bridge, hints)
    assert merged is not None and merged.reason == "bpe_merge_across_junction"
    far = id_divergence(tok, canonical, held + bridge, hints_for(qwen3, CONVERSATION))
    assert far is not None and far.reason == "tokenization_differs"


def test_assistant_in_appended_span(qwen3: TemplateRenderer) -> None:
    head = qwen3.render_text(CONVERSATION[:4], tools=[TOOL])
    injected = [*CONVERSATION, {"role": "assistant", "content": "(injected) Sure."},
                {"role": "user", "content": "Go on."}]
    expected = qwen3.render_text(injected, tools=[TOOL], add_generation_prompt=True)
    actual = expected.replace("(injected) Sure.", "(injected)  Sure.")
    div = text_divergence(expected, actual, hints_for(
        qwen3, injected, appended_start=len(head), appended_assistant=True))
    assert div is not None and div.reason == "assistant_in_appended_span"


def test_verifier_reports_reasons() -> None:
    """The published Qwen3 template drops earlier reasoning: each failed case says so."""
    renderer = build_renderer("default", tokenizer_dir("qwen3"))
    report = verify_renderer(renderer, thinking="on")
    summary = report.summary()
    assert not report.passed
    assert summary["first_failure_reason"] == "reasoning_dropped"
    assert set(summary["reasons"]) == {"reasoning_dropped"}
    token_case = next(c for c in report.cases if c.check == "token_prefix" and not c.passed)
    div = token_case.divergence
    assert div is not None and div["token_index"] is not None
    assert div["expected_id"] != div["actual_id"]
    assert "<think>" in div["actual_text"]


def test_comparator_items_carry_reason_and_first_diff(qwen3: TemplateRenderer) -> None:
    tok = qwen3.tokenizer
    messages = CONVERSATION[:4]
    held = tok.encode(qwen3.render_text(messages, tools=[TOOL]).rstrip("\n"))
    assert held[-1] in qwen3.stop_ids
    assert mismatch_report(qwen3, messages, held, tools=[TOOL]) == []
    bad = tok.encode(qwen3.render_text(messages, tools=[TOOL]).rstrip("\n")
                     .replace('"days": 2', '"days": 2.0'))
    (item,) = mismatch_report(qwen3, messages, bad, tools=[TOOL])
    assert item["type"] == "assistant_text" and item["reason"] == "value_reserialized"
    first = item["first_diff"]
    k = first["token_index"]
    assert bad[:k] == held[:k] and (first["expected_id"], first["actual_id"]) == (held[k], bad[k])


def test_comparator_per_turn_kwargs_still_finds_a_real_mismatch(qwen3: TemplateRenderer
                                                                  ) -> None:
    """Turns compared under their own kwargs: a real difference in the second run is found."""
    tok = qwen3.tokenizer
    on, off = {"enable_thinking": True}, {"enable_thinking": False}
    first = [{"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."}]
    second = [{"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye."}]
    text1 = qwen3.render_text(first, template_kwargs=on).rstrip("\n")
    full = qwen3.render_text([*first, *second], template_kwargs=off).rstrip("\n")
    held = tok.encode(text1)
    assert full.startswith(text1 + "\n")
    ids = held + tok.encode(full[len(text1):])
    turns = [TurnSpan(2, len(held), on), TurnSpan(4, len(ids), off)]
    assert mismatch_report(qwen3, first + second, ids, turns=turns) == []
    bad = held + tok.encode(full[len(text1):].replace("Bye<|im_end|>", "Bye!<|im_end|>", 1))
    (item,) = mismatch_report(qwen3, first + second, bad, turns=turns)
    assert item["type"] == "non_assistant_text" and item["reason"] == "text_differs"
    assert item["first_diff"]["token_index"] >= len(held)


LAST_ONLY_REASONING = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and loop.last and m.reasoning_content %}"
    "<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_declined_bridge_says_why(tmp_path: Path) -> None:
    """A template that shows reasoning only on the last message: the live bridge's 400
    (template_not_append_only) names the typed reason."""
    template = tmp_path / "last_only.jinja"
    template.write_text(LAST_ONLY_REASONING)
    renderer = build_renderer("default", tokenizer_dir("qwen3"), chat_template=template)
    previous = {"role": "assistant", "content": "Hi.", "reasoning_content": "Greet."}
    with pytest.raises(TokenizationError) as info:
        renderer.bridge(previous, renderer.primary_stop_id,
                        [{"role": "user", "content": "Bye."}])
    assert info.value.code == "template_not_append_only"
    assert "reason: reasoning_dropped" in info.value.message
