"""Families glm5 (GLM-5.1), kimi_k25 (Kimi K2.5) and kimi_k3 (Kimi K3): the bundled
templates are the fixtures', the pinned kwargs are what makes them append-only, the
junctions, thinking switches and efforts, and what kimi_k3 refuses (kwargs that put a system
message after the last message). The verifier itself runs in test_families.py."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
from helpers.support import tokenizer_dir

from tito.cli import verify_template as verify_cli
from tito.render import TemplateRenderer, build_renderer
from tito.render.base import normalize_messages
from tito.render.families import family_module
from tito.render.template import render_template
from tito.render.verify import trajectory_pool
from tito.types.errors import BadRequest

NEW = ["glm5", "kimi_k25", "kimi_k3"]
_CACHE: dict[str, TemplateRenderer] = {}


def get(family: str) -> TemplateRenderer:
    if family not in _CACHE:
        _CACHE[family] = build_renderer(family, "standin")
    return _CACHE[family]


def fixture_template(family: str) -> str:
    folder, name = family_module(family).TEMPLATE_FIXTURE
    return (tokenizer_dir(folder) / name).read_text()


CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
     "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21"},
    {"role": "assistant", "content": "21°C.", "reasoning_content": "It says 21."},
]


@pytest.mark.parametrize("family", NEW)
def test_bundled_template_is_the_fixture_verbatim(family: str) -> None:
    header, _, body = get(family).template.partition("-#}\n")
    assert header.startswith("{#-") and "unchanged" in header
    assert body == fixture_template(family)


@pytest.mark.parametrize(("family", "kwarg"), [("glm5", "clear_thinking"),
                                               ("kimi_k25", "preserve_thinking")])
def test_the_fixture_drops_history_reasoning_unless_pinned(family: str, kwarg: str) -> None:
    template = fixture_template(family)
    later = [*HISTORY, {"role": "user", "content": "And Oslo?"}]

    def render(messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> str:
        return render_template(template, normalize_messages(messages), tools=TOOLS,
                               add_generation_prompt=False,
                               kwargs=kwargs, special_tokens={"bos_token": None,
                                                              "eos_token": None})

    earlier = HISTORY[:3]  # up to the tool result: the call's reasoning is shown
    assert "Call the tool." in render(earlier, {})
    assert "Call the tool." not in render(later, {})  # upstream drops it later on
    r = get(family)
    pinned = r.spec.pinned_kwargs
    assert list(pinned) == [kwarg]
    assert render(later, pinned).startswith(render(earlier, pinned))
    assert "Call the tool." in r.render_text(later, tools=TOOLS)
    with pytest.raises(BadRequest) as err:
        r.render_text(later, template_kwargs={kwarg: not pinned[kwarg]})
    assert err.value.code == "template_kwarg_conflict"


def test_glm5_drops_the_stop_token_that_opens_the_next_message() -> None:
    r = get("glm5")
    completion = r.render_completion(HISTORY[1], tools=TOOLS)
    assert r.tokenizer.decode(completion[-1:]) == "<|observation|>"
    bridge = r.bridge(HISTORY[1], completion[-1], [HISTORY[2]], tools=TOOLS)
    assert bridge.drop == 1
    assert r.tokenizer.decode(bridge.ids) == \
        "<|observation|><tool_response>21</tool_response><|assistant|><think>"
    retry = r.bridge(HISTORY[1], completion[-1], [{"role": "user", "content": "retry"}],
                     tools=TOOLS, template_kwargs={"enable_thinking": False})
    assert retry.drop == 1 and r.tokenizer.decode(retry.ids) == \
        "<|user|>retry<|assistant|></think>"
    assert r.tokenizer.decode(r.render_completion(HISTORY[3], tools=TOOLS)) == \
        "It says 21.</think>21°C.<|user|>"


def test_kimi_k25_thinking_switch_and_null_reasoning() -> None:
    r = get("kimi_k25")
    assert r.render_text([HISTORY[0]], add_generation_prompt=True).endswith(
        "<|im_assistant|>assistant<|im_middle|><think>")
    off = {"thinking": False}
    assert r.render_text([HISTORY[0]], add_generation_prompt=True,
                         template_kwargs=off).endswith("<think></think>")
    assert r.thinking_enabled(None) and not r.thinking_enabled(off)
    injected = {"role": "assistant", "content": "Hi.", "reasoning_content": None}
    assert "None" not in r.render_text([HISTORY[0], injected])
    # tool-call ids are Kimi's functions.NAME:IDX, results follow them
    text = r.render_text(HISTORY[:3], tools=TOOLS)
    assert "<|tool_call_begin|>functions.get_weather:0" in text
    assert "## Return of functions.get_weather:0\n21" in text


@pytest.mark.parametrize("kwargs", [
    {"tool_choice": "required"}, {"tool_choice": "none"},
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
    {"response_schema": {"type": "object"}},
])
def test_kimi_k3_refuses_kwargs_that_add_a_trailing_system_message(
        kwargs: dict[str, Any]) -> None:
    r = get("kimi_k3")
    with pytest.raises(BadRequest) as err:
        r.render_prompt([HISTORY[0]], template_kwargs=kwargs)
    assert err.value.code == "template_kwarg_not_append_only"
    assert next(iter(kwargs)) in err.value.message
    with pytest.raises(BadRequest):
        r.bridge(HISTORY[1], None, [HISTORY[2]], tools=TOOLS, template_kwargs=kwargs)


@pytest.mark.parametrize("kwargs", [{"tool_choice": "auto"},
                                    {"response_format": {"type": "text"}}])
def test_kimi_k3_tolerates_kwargs_that_render_nothing(kwargs: dict[str, Any]) -> None:
    r = get("kimi_k3")
    assert r.render_text([HISTORY[0]], template_kwargs=kwargs, add_generation_prompt=True) \
        == r.render_text([HISTORY[0]], add_generation_prompt=True)


@pytest.mark.parametrize(("effort", "expected"), [
    ("none", {"thinking": False}), ("minimal", {"thinking": False}),
    ("low", {"thinking": True, "thinking_effort": "low"}),
    ("medium", {"thinking": True, "thinking_effort": "high"}),
    ("high", {"thinking": True, "thinking_effort": "high"}),
    ("xhigh", {"thinking": True, "thinking_effort": "max"}),
])
def test_kimi_k3_effort(effort: str, expected: dict[str, Any]) -> None:
    r = get("kimi_k3")
    kwargs = r.effort_kwargs(effort)
    assert kwargs == expected
    text = r.render_text([HISTORY[0]], template_kwargs=kwargs, add_generation_prompt=True)
    level = expected.get("thinking_effort")
    assert (f"`thinking_effort={level}`" in text) == (level is not None)
    assert text.endswith("<|open|>think<|sep|>" if expected["thinking"]
                         else "<|open|>response<|sep|>")


def test_kimi_k3_tool_results_follow_the_calls_order() -> None:
    r = get("kimi_k3")
    second = {**CALL, "id": "call_2", "function": {"name": "calculator",
                                                   "arguments": '{"expression": "1+1"}'}}
    calls = {"role": "assistant", "content": "", "tool_calls": [CALL, second]}
    completion = r.render_completion(calls)
    results = [{"role": "tool", "tool_call_id": "call_2", "content": "2"},
               {"role": "tool", "tool_call_id": "call_1", "content": "21"}]
    bridge = r.bridge(calls, completion[-1], results)
    assert bridge.drop == 0
    assert r.tokenizer.decode(bridge.ids) == (
        '<|open|>message role="tool" tool="get_weather" index="1"<|sep|>21<|close|>message'
        '<|sep|><|end_of_msg|><|open|>message role="tool" tool="calculator" index="2"<|sep|>'
        '2<|close|>message<|sep|><|end_of_msg|><|open|>message role="assistant"<|sep|>'
        '<|open|>think<|sep|>')


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    verify_cli.add_arguments(parser)
    return verify_cli.run(parser.parse_args(list(argv)))


@pytest.mark.parametrize("family", NEW)
def test_verify_template_passes_on_the_standin(family: str,
                                               capsys: pytest.CaptureFixture) -> None:
    assert _cli("--tokenizer", "standin", "--family", family, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["checks"]["token_prefix"][0] > 0
    assert report["checks"]["parse_round_trip"][0] == report["checks"]["parse_round_trip"][1]


def test_verify_template_fails_kimi_k3_with_a_refused_kwarg(
        capsys: pytest.CaptureFixture) -> None:
    assert _cli("--tokenizer", "standin", "--family", "kimi_k3",
                "--kwargs", '{"tool_choice": "required"}') == 1
    assert "verdict: FAIL" in capsys.readouterr().out


def test_pool_render_equals_canonical_for_every_new_family() -> None:
    for family in NEW:  # the pool's longest trajectory, rendered as the gateway would
        r = get(family)
        _, messages, tools = trajectory_pool()[0]
        prompt = r.render_prompt(messages[:2], tools=tools)
        assert r.tokenizer.decode(prompt) == r.render_text(messages[:2], tools=tools,
                                                           add_generation_prompt=True)
