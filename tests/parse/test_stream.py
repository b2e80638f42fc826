"""Streaming deltas (tito/parse/stream.py) over a real family parser: fed the ids of a
completion one at a time, the deltas never show a marker, never split a character, and
add up to exactly the completion parsed whole."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.support import tokenizer_dir

from tito.parse.base import stable_call_ids
from tito.parse.stream import DeltaStream
from tito.render import build_renderer
from tito.render.base import TemplateRenderer
from tito.types.messages import ParsedCompletion

TEXTS = [
    "<think>\nLet me see: 42 is 6 × 7.\n</think>\n\nThe answer is 42. 🎉 答案是四十二。",
    "<think>\n\n</think>\n\nI'll check.\n<tool_call>\n{\"name\": \"get_weather\", "
    "\"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
    "\"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n</tool_call>",
    "Plain text with a literal < sign and <tool_ text that is not a call.   ",
    "<think>\nthinking about <tool_call> in prose\n</think>\n\nDone.",
]


@pytest.fixture(scope="module")
def qwen3() -> TemplateRenderer:
    return build_renderer("qwen3", tokenizer_dir("qwen3"))


def stream_all(renderer: TemplateRenderer, ids: list[int]) -> tuple[list[Any], DeltaStream,
                                                                     ParsedCompletion]:
    def parse(prefix: Any, finish: str) -> ParsedCompletion:
        return stable_call_ids(renderer.parse(prefix, finish), "resp-1")

    stream = DeltaStream(parse, every=1)
    deltas = [stream.update(ids[:n]) for n in range(1, len(ids) + 1)]
    final = parse(ids, "stop")
    deltas.append(stream.finish(final))
    return deltas, stream, final


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_whole_parse(qwen3: TemplateRenderer, text: str) -> None:
    ids = qwen3.tokenizer.encode(text) + qwen3.tokenizer.encode("<|im_end|>")
    deltas, stream, final = stream_all(qwen3, ids)
    assert not stream.diverged
    assert "".join(d.content for d in deltas) == (final.content or "")
    assert "".join(d.reasoning for d in deltas) == (final.reasoning_content or "")
    assert [c for d in deltas for c in d.calls] == final.tool_calls
    for d in deltas[:-1]:  # while generating: no marker, no cut character
        assert "<tool_call" not in d.content and "\ufffd" not in d.content + d.reasoning
    if final.tool_calls:  # a call is sent once complete, before the end
        assert any(d.calls for d in deltas[:-1])


def test_a_reinterpreted_field_is_not_continued(qwen3: TemplateRenderer) -> None:
    def parse(prefix: Any, finish: str) -> ParsedCompletion:
        return ParsedCompletion(content="streamed so far")

    stream = DeltaStream(parse, every=1)
    assert stream.update([1]).content == "streamed so far"
    rest = stream.finish(ParsedCompletion(content="something else"))
    assert rest.content == "" and stream.diverged == ["content"]


FAMILY_MESSAGE = {"role": "assistant", "content": "I'll check both. 🌦", "reasoning_content":
                  "Two cities: Zürich and 東京.", "tool_calls": [
                      {"id": "c1", "type": "function", "function": {
                          "name": "get_weather", "arguments": '{"city": "Zürich"}'}},
                      {"id": "c2", "type": "function", "function": {
                          "name": "get_weather", "arguments": '{"city": "東京"}'}}]}


@pytest.mark.parametrize("family,markers,early", [
    ("deepseek_v41", ("｜DSML｜", "</think>"), False),  # one block: its calls close together
    ("inkling", ("<|message_model|>", "<|content_", "<|end_message|>", "get_weather"), True),
])
def test_family_markers_are_held_back(family: str, markers: tuple[str, ...],
                                      early: bool) -> None:
    """Fed one id at a time, a family's call and reasoning markers never reach a delta;
    the deltas add up to the whole parse (an Inkling call, a message of its own, is sent
    before the next one is generated)."""
    r = build_renderer(family, "standin")
    kwargs = {r.spec.thinking_kwarg: True} if r.spec.thinking_kwarg else None
    ids = r.render_completion(FAMILY_MESSAGE, template_kwargs=kwargs)
    deltas, stream, final = stream_all(r, ids)
    assert not stream.diverged
    assert (final.content, final.reasoning_content) == ("I'll check both. 🌦",
                                                        "Two cities: Zürich and 東京.")
    assert "".join(d.content for d in deltas) == final.content
    assert "".join(d.reasoning for d in deltas) == final.reasoning_content
    assert [c for d in deltas for c in d.calls] == final.tool_calls and len(final.tool_calls) == 2
    assert any(d.calls for d in deltas[:-1]) or not early
    for d in deltas:
        assert not any(m in d.content + d.reasoning for m in markers), d
