"""The MiniMax-M3 and Gemma 4 tool-call syntaxes (nested values, parallel calls, empty
arguments) parse back to the arguments rendered, and a completion streamed id by id never
shows a family marker and adds up to the whole parse."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tito.parse.base import stable_call_ids
from tito.parse.gemma import parse_arguments
from tito.parse.stream import DeltaStream
from tito.render import TemplateRenderer, build_renderer

_CACHE: dict[str, TemplateRenderer] = {}
NESTED = {"city": "Zürich", "days": 3, "ratio": 2.5, "metric": True, "alerts": False,
          "tags": ["a", "b c"], "where": {"lat": -1.5, "near": [{"name": "x"}]}}
ON = {"minimax_m3": {"thinking_mode": True}, "gemma4": {"enable_thinking": True},
      "minimax_m25": None}


def get(family: str) -> TemplateRenderer:
    if family not in _CACHE:
        _CACHE[family] = build_renderer(family, "standin")
    return _CACHE[family]


def call(name: str, args: dict[str, Any], cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


MESSAGE = {"role": "assistant", "content": "Let me check 東京 and <this>.",
           "reasoning_content": "Two calls: weather then math.",
           "tool_calls": [call("get_weather", NESTED, "a"), call("ping", {}, "b")]}


@pytest.mark.parametrize("family", ["minimax_m3", "gemma4", "minimax_m25"])
def test_nested_parallel_calls_round_trip(family: str) -> None:
    r = get(family)
    ids = r.render_completion(MESSAGE, template_kwargs=ON[family])
    parsed = r.parse(ids, "stop")
    assert parsed.content == MESSAGE["content"]
    assert parsed.reasoning_content == MESSAGE["reasoning_content"]
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
           for c in parsed.tool_calls]
    assert got == [("get_weather", NESTED), ("ping", {})]
    assert parsed.finish_reason == "tool_calls"


@pytest.mark.parametrize("family", ["minimax_m3", "gemma4", "minimax_m25"])
def test_streamed_deltas_hold_back_the_markers(family: str) -> None:
    r = get(family)
    ids = r.render_completion(MESSAGE, template_kwargs=ON[family])

    def parse(prefix: Any, finish: str) -> Any:
        return stable_call_ids(r.parse(prefix, finish), "resp-1")

    stream = DeltaStream(parse, every=1)
    deltas = [stream.update(ids[:n]) for n in range(1, len(ids) + 1)]
    final = parse(ids, "stop")
    deltas.append(stream.finish(final))
    assert not stream.diverged
    assert "".join(d.content for d in deltas) == final.content
    assert "".join(d.reasoning for d in deltas) == final.reasoning_content
    assert [c for d in deltas for c in d.calls] == final.tool_calls
    markers = ("]<]minimax[>[", "<|tool_call>", "<minimax:tool_call>", "<channel|>",
               "</mm:think>", "</think>", "<|\"|>")
    for d in deltas[:-1]:
        assert not any(m in d.content + d.reasoning for m in markers), d


def test_gemma_values() -> None:
    q = '<|"|>'
    assert parse_arguments(f"a:{q}x, y{q},b:[1,-2.5e3,null,true],c:{{d:{q}{q}}}") == {
        "a": "x, y", "b": [1, -2500.0, None, True], "c": {"d": ""}}
    assert parse_arguments(f"{q}k{q}:1") == {"k": 1}
    assert parse_arguments("") == {}
    for bad in (f"a:{q}open", "a:", "a:[1,", ":1", "a:1,,b:2"):
        assert parse_arguments(bad) is None, bad


def test_m3_adaptive_and_disabled_outputs() -> None:
    r = get("minimax_m3")
    tok = r.tokenizer
    adaptive = r.parse(tok.encode("</mm:think>Just this.[e~["), "stop")
    assert (adaptive.reasoning_content, adaptive.content) == ("", "Just this.")
    thought = r.parse(tok.encode("<mm:think>hm</mm:think>Yes.[e~["), "stop")
    assert (thought.reasoning_content, thought.content) == ("hm", "Yes.")
    disabled = r.parse(tok.encode("Plain.[e~["), "stop")
    assert (disabled.reasoning_content, disabled.content) == (None, "Plain.")
