"""MiniMax-M3, MiniMax-M2.5 and Gemma 4: the published templates break the prefix (so the
families bundle corrected ones), the corrected ones pass the verifier in every mode
(M3's ``adaptive``, Gemma-4-31B-it's ``empty_thought``), thinking switches, and Gemma's
tool results inside the model turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.support import tokenizer_dir

from tito.render import TemplateRenderer, build_renderer
from tito.render.families import family_module, standin_for
from tito.render.verify import verify_renderer
from tito.types.errors import BadRequest

_CACHE: dict[str, TemplateRenderer] = {}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
USER = [{"role": "user", "content": "Weather?"}]


def get(family: str) -> TemplateRenderer:
    if family not in _CACHE:
        _CACHE[family] = build_renderer(family, "standin")
    return _CACHE[family]


def published(family: str, folder: str, name: str) -> TemplateRenderer:
    path: Path = tokenizer_dir(folder) / name
    return family_module(family).build(standin_for(family), path.read_text())


@pytest.mark.parametrize("family,folder,name", [
    ("minimax_m3", "minimax-m3", "chat_template.jinja"),
    ("minimax_m25", "minimax-m3", "chat_template_minimax-m2.5_miles-patched.jinja"),
    ("gemma4", "gemma-4", "chat_template.jinja"),
    ("gemma4", "gemma-4", "chat_template_31b-it.jinja"),
])
def test_the_published_template_is_not_append_only(family: str, folder: str,
                                                   name: str) -> None:
    report = verify_renderer(published(family, folder, name))
    assert not report.passed  # hence the corrected template the family bundles


@pytest.mark.parametrize("family,kwargs", [("minimax_m3", {"thinking_mode": "adaptive"}),
                                           ("gemma4", {"empty_thought": True})])
def test_other_modes_pass_the_verifier(family: str, kwargs: dict) -> None:
    report = verify_renderer(get(family), kwargs=kwargs)
    assert report.passed, [c for c in report.cases if not c.passed][:3]
    assert report.checks()["token_prefix"][0] > 0


@pytest.mark.parametrize("kwargs,prompt", [
    ({"thinking_mode": True}, "]~b]ai\n<mm:think>"),
    ({"thinking_mode": "enabled"}, "]~b]ai\n<mm:think>"),
    ({"thinking_mode": False}, "]~b]ai\n</mm:think>"),
    ({"thinking_mode": "adaptive"}, "]~b]ai\n"),
    (None, "]~b]ai\n"),
])
def test_m3_thinking_mode_from_a_boolean_or_its_own_values(kwargs: dict | None,
                                                            prompt: str) -> None:
    r = get("minimax_m3")
    text = r.render_text(USER, template_kwargs=kwargs, add_generation_prompt=True)
    assert text.endswith("[e~[\n" + prompt)
    mode = {True: "enabled", False: "disabled"}.get((kwargs or {}).get("thinking_mode"),
                                                     (kwargs or {}).get("thinking_mode"))
    assert f"Current thinking mode: {mode or 'adaptive'}." in text
    assert r.thinking_enabled(kwargs) is (mode != "disabled")


def test_m3_efforts_and_the_empty_block_of_enabled_mode() -> None:
    r = get("minimax_m3")
    assert r.effort_kwargs("none") == {"thinking_mode": False}
    assert r.effort_kwargs("high") == {"thinking_mode": True}
    plain = {"role": "assistant", "content": "Hi."}
    on = r.render_completion(plain, template_kwargs={"thinking_mode": True})
    assert r.tokenizer.decode(on) == "</mm:think>Hi.[e~["  # after the prompt's <mm:think>
    adaptive = r.render_completion(plain, template_kwargs={"thinking_mode": "adaptive"})
    assert r.tokenizer.decode(adaptive) == "</mm:think>Hi.[e~["
    parsed = r.parse(adaptive, "stop")
    assert (parsed.content, parsed.reasoning_content) == ("Hi.", "")


def test_m25_pins_clear_thinking() -> None:
    r = get("minimax_m25")
    assert r.capability_report()["pinned_kwargs"] == {"clear_thinking": False}
    with pytest.raises(BadRequest) as err:
        r.effective_kwargs({"clear_thinking": True})
    assert err.value.code == "template_kwarg_conflict"
    history = [*USER, {"role": "assistant", "content": "A."}, {"role": "user", "content": "B"}]
    assert "<think>\n\n</think>\n\nA." in r.render_text(history)


def test_gemma_tool_results_continue_the_model_turn() -> None:
    r = get("gemma4")
    call = {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]}
    completion = r.render_completion(call, tools=TOOLS)
    text = r.tokenizer.decode(completion)
    assert text == ('Checking.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
                    "<|tool_response>")
    for on in (True, False):
        bridge = r.bridge(call, completion[-1], [{"role": "tool", "tool_call_id": "call_1",
                                                  "content": "sunny"}],
                          tools=TOOLS, template_kwargs={"enable_thinking": on})
        appended = r.tokenizer.decode(bridge.ids)
        assert bridge.drop == 0 and "<|turn>" not in appended  # no new model turn
        assert appended == ('response:get_weather{value:<|"|>sunny<|"|>}<tool_response|>'
                            + ("<|channel>thought\n" if on else ""))
    plain = {"role": "assistant", "content": "Hi."}
    bridge = r.bridge(plain, r.render_completion(plain)[-1], USER)
    assert r.tokenizer.decode(bridge.ids) == "\n<|turn>user\nWeather?<turn|>\n<|turn>model\n"


def test_gemma_thinking_and_the_31b_empty_thought_block() -> None:
    r = get("gemma4")
    assert r.capability_report()["pinned_kwargs"] == {"preserve_thinking": True}
    on = r.render_text(USER, template_kwargs={"enable_thinking": True},
                       add_generation_prompt=True)
    assert on.startswith("<bos><|turn>system\n<|think|>\n")
    assert on.endswith("<|turn>model\n<|channel>thought\n")
    off31 = r.render_text(USER, template_kwargs={"empty_thought": True},
                          add_generation_prompt=True)
    assert off31.endswith("<|turn>model\n<|channel>thought\n<channel|>")
    plain = {"role": "assistant", "content": "Hi."}
    history = r.render_text([*USER, plain], template_kwargs={"empty_thought": True})
    assert history.startswith(off31)  # the prompt's empty block stays in the history
    # reasoning before an older user turn stays (published: dropped)
    old = [*USER, {**plain, "reasoning_content": "greet"}, {"role": "user", "content": "x"}]
    assert "<|channel>thought\ngreet\n<channel|>Hi.<turn|>" in r.render_text(old)
