"""Streaming deltas (tito/parse/stream.py) over a real family parser: fed the ids of a
completion one at a time, the deltas never show a marker, never split a character, and
add up to exactly the completion parsed whole."""

from __future__ import annotations

import json
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


FAMILY_TOKENIZERS: dict[str, str | None] = {
    "qwen38": "qwen3.5",
    "qwen36": "qwen3.5",
    "nemotron35": None,  # stand-in
}
MARKERS = ("<think", "</think", "<tool_call", "</tool_call", "<function=", "<parameter=",
           "<|im_end|>")


def _call(cid: str, city: str) -> dict[str, Any]:
    return {"id": cid, "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


@pytest.mark.parametrize("family", sorted(FAMILY_TOKENIZERS))
def test_family_markers_are_held_back(family: str) -> None:
    """A completion with reasoning, text and two XML calls, streamed id by id over the
    family's parser: no marker (or a piece of one) ever reaches a delta."""
    folder = FAMILY_TOKENIZERS[family]
    renderer = build_renderer(family, tokenizer_dir(folder) if folder else "standin")
    message = {"role": "assistant", "content": "Checking a < b for 東京.",
               "reasoning_content": "Two cities: 6 × 7 calls? No, two.",
               "tool_calls": [_call("call_a", "Zürich"), _call("call_b", "東京")]}
    ids = renderer.render_completion(message, template_kwargs={"enable_thinking": True})
    deltas, stream, final = stream_all(renderer, ids)
    assert not stream.diverged
    assert final.reasoning_content == message["reasoning_content"]
    assert final.content == message["content"] and len(final.tool_calls) == 2
    assert "".join(d.content for d in deltas) == final.content
    assert "".join(d.reasoning for d in deltas) == final.reasoning_content
    assert [c for d in deltas for c in d.calls] == final.tool_calls
    for d in deltas[:-1]:
        text = d.content + d.reasoning
        assert not any(m in text for m in MARKERS) and "\ufffd" not in text, d
    assert any(d.calls for d in deltas[:-1])
FAMILY_MARKERS = ("<tool_call", "<arg_", "</think", "<think", "<|tool_call", "<|open|>",
                  "<|close|>", "<|sep|>")
STREAMED_FAMILIES = [
    "glm5",
    "kimi_k25",
    "kimi_k3",
]
"""Families whose own markers are streamed through here (stand-in tokenizers)."""
CALLS_MESSAGE = {
    "role": "assistant", "content": "I'll check both. 東京 🚀", "reasoning_content":
    "Two cities: call the tool twice.",
    "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Zürich"}'}},
        {"id": "c2", "type": "function", "function": {
            "name": "calculator", "arguments": '{"expression": "6*7", "n": 2}'}}]}


@pytest.mark.parametrize("family", STREAMED_FAMILIES)
def test_second_wave_markers_are_held_back(family: str) -> None:
    renderer = build_renderer(family, "standin")
    kwargs = {renderer.spec.thinking_kwarg: True} if renderer.spec.thinking_kwarg else None
    ids = renderer.render_completion(CALLS_MESSAGE, template_kwargs=kwargs)
    deltas, stream, final = stream_all(renderer, ids)
    assert not stream.diverged
    assert final.reasoning_content == CALLS_MESSAGE["reasoning_content"]
    assert final.content == CALLS_MESSAGE["content"]
    assert "".join(d.content for d in deltas) == final.content
    assert "".join(d.reasoning for d in deltas) == final.reasoning_content
    assert [c for d in deltas for c in d.calls] == final.tool_calls
    assert [c["function"]["name"] for c in final.tool_calls] == ["get_weather", "calculator"]
    for d in deltas:
        assert not any(m in d.content + d.reasoning for m in FAMILY_MARKERS), d
    assert any(d.calls for d in deltas[:-1])  # calls are sent before the end


@pytest.mark.parametrize("family", ["glm47", "nemotron3", "deepseek_v32", *STREAMED_FAMILIES])
def test_thinking_off_streams_the_answer_as_content(family: str) -> None:
    """A prompt that closed the reasoning block itself (thinking off): the output so far is
    the answer, streamed as content (not as reasoning that the committed parse then
    reads as content), and a cut turn commits it as content too."""
    renderer = build_renderer(family, "standin")
    kwarg = renderer.spec.thinking_kwarg
    assert kwarg is not None
    off = {kwarg: False}
    ids = renderer.render_completion({"role": "assistant", "content": "The answer, 42."},
                                     template_kwargs=off)
    stream = DeltaStream(renderer.stream_parse(off), every=1)
    deltas = [stream.update(ids[:n]) for n in range(1, len(ids) + 1)]
    final = renderer.parse_turn(ids, "stop", off)
    deltas.append(stream.finish(final))
    assert not stream.diverged
    assert (final.reasoning_content, final.content) == (None, "The answer, 42.")
    assert "".join(d.reasoning for d in deltas) == ""
    assert "".join(d.content for d in deltas) == "The answer, 42."
    cut = renderer.parse_turn(ids[:-3], "length", off)
    assert cut.reasoning_content is None and cut.content and cut.finish_reason == "length"
    words = renderer.tokenizer.encode("The answer")  # thinking on: a cut output is reasoning
    assert renderer.parse_turn(words, "length", {kwarg: True}).reasoning_content == \
        "The answer"
    assert renderer.parse_turn(words, "length", off).content == "The answer"
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
def test_dsml_and_inkling_markers_are_held_back(family: str, markers: tuple[str, ...],
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
