"""Kimi K3 XTML completions (tito/parse/xtml.py) over the kimi_k3 stand-in: typed
arguments round-trip through the template, attribute escapes, the JSON-block form, the
thinking-off form, malformed and cut tool sections kept in content, never dropped."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tito.render import TemplateRenderer, build_renderer


@pytest.fixture(scope="module")
def k3() -> TemplateRenderer:
    return build_renderer("kimi_k3", "standin")


def call(name: str, args: Any) -> dict[str, Any]:
    return {"id": "x", "type": "function", "function": {"name": name, "arguments": args}}


ARGS = {"city": 'Zürich "centre" & co', "limit": 3, "ratio": 0.5, "exact": True,
        "none": None, "filters": {"year": 2024, "tags": ["a", "b"]}, "ids": [1, 2],
        "numeric_string": "42", 'key "q"&': "v"}


@pytest.mark.parametrize("thinking", [True, False])
def test_typed_arguments_round_trip(k3: TemplateRenderer, thinking: bool) -> None:
    message: dict[str, Any] = {"role": "assistant", "content": " spaced \n",
                               "tool_calls": [call("search", json.dumps(ARGS))]}
    if thinking:
        message["reasoning_content"] = "\nkept exactly\n"
    ids = k3.render_completion(message, template_kwargs={"thinking": thinking})
    text = k3.tokenizer.decode(ids)
    assert 'type="number"<|sep|>3<' in text and 'type="string"<|sep|>42<' in text
    assert 'key="key &quot;q&quot;&amp;"' in text  # attributes are escaped
    parsed = k3.parse(ids, "stop")
    assert parsed.content == " spaced \n"  # the template renders content unstripped
    assert parsed.reasoning_content == ("\nkept exactly\n" if thinking else None)
    [got] = parsed.tool_calls
    assert got["function"]["name"] == "search"
    assert json.loads(got["function"]["arguments"]) == ARGS
    assert parsed.finish_reason == "tool_calls"


def test_json_block_arguments(k3: TemplateRenderer) -> None:
    message = {"role": "assistant", "content": "",
               "tool_calls": [call("f", '{"a": [1, {"b": null}]}')]}
    text = k3.render_text([{"role": "user", "content": "x"}, message])
    assert '<|open|>json type="object"<|sep|>' not in text  # mappings use typed arguments
    raw = ('r<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>'
           '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>json '
           'type="object"<|sep|>{"a": [1, {"b": null}]}<|close|>json<|sep|><|close|>call<|sep|>'
           '<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>')
    parsed = k3.parse(k3.tokenizer.encode(raw), "stop")
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [
        {"a": [1, {"b": None}]}]
    assert parsed.content is None and parsed.reasoning_content == "r"


@pytest.mark.parametrize("bad", [
    '<|open|>argument key="n" type="number"<|sep|>many<|close|>argument<|sep|>',
    '<|open|>argument key="n" type="boolean"<|sep|>1<|close|>argument<|sep|>',
    '<|open|>argument key="n" type="widget"<|sep|>1<|close|>argument<|sep|>',
    'stray<|open|>argument key="n" type="string"<|sep|>v<|close|>argument<|sep|>',
])
def test_a_call_that_does_not_parse_stays_in_content(k3: TemplateRenderer, bad: str) -> None:
    tail = (f'<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|>{bad}<|close|>call'
            '<|sep|><|close|>tools<|sep|><|close|>message<|sep|>')
    parsed = k3.parse(k3.tokenizer.encode(f"Hi<|close|>response<|sep|>{tail}<|end_of_msg|>"),
                      "stop")
    assert parsed.tool_calls == [] and parsed.finish_reason == "stop"
    assert parsed.content == f"Hi<|close|>response<|sep|>{tail}"


def test_cut_completions(k3: TemplateRenderer) -> None:
    tok = k3.tokenizer
    thinking = k3.parse(tok.encode("still thinking<|close|>th"), "length")
    assert (thinking.reasoning_content, thinking.content) == ("still thinking<|close|>th", "")
    answer = k3.parse(tok.encode("r<|close|>think<|sep|><|open|>response<|sep|>Hel"), "length")
    assert (answer.reasoning_content, answer.content) == ("r", "Hel")
    one = ('<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument key="a" '
           'type="number"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|>')
    cut = k3.parse(tok.encode(f"Ok<|close|>response<|sep|>{one}<|open|>call to"), "length")
    assert [c["function"]["name"] for c in cut.tool_calls] == ["f"]  # the complete call
    assert cut.content == "Ok<|close|>response<|sep|><|open|>tools<|sep|><|open|>call to"
    assert cut.finish_reason == "length"


def test_thinking_off_answer(k3: TemplateRenderer) -> None:
    ids = k3.render_completion({"role": "assistant", "content": "Plain."},
                               template_kwargs={"thinking": False})
    assert k3.tokenizer.decode(ids) == \
        "Plain.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    parsed = k3.parse(ids, "stop")
    assert (parsed.reasoning_content, parsed.content, parsed.tool_calls) == \
        (None, "Plain.", [])
    assert k3.reasoning_tokens(ids, parsed) == 0
