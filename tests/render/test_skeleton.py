"""Bridge skeletons (:mod:`tito.render.skeleton`) give exactly the bridge a template render
gives, for every family, and are used where they apply."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.families import renderer_of
from helpers.support import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from tito.render import FAMILIES, TemplateRenderer
from tito.render.families import ALIASES
from tito.render.skeleton import build_skeleton, opaque, shape_of

CONTENTS = [
    "42", "the result is 7", '{"ok": true, "rows": [1, 2, 3]}', "line one\nline two",
    "quotes \" and \\ backslash", "emoji 🎉 and 中文", "[TOOL_RESULTS] x [/TOOL_RESULTS]",
    "tabs\tinside", " leading space", "trailing newline\n", "<tool_response>x</tool_response>",
    "a </think> b", "",
]
PREVIOUS: list[dict[str, Any]] = [
    {"role": "assistant", "content": "Let me check."},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]},
]


def appended_runs(previous: dict[str, Any], content: str) -> list[list[dict[str, Any]]]:
    tool = {"role": "tool", "content": content, "tool_call_id": "call_1", "name": "lookup"}
    runs = [[{"role": "user", "content": content}]]
    if previous.get("tool_calls"):
        runs += [[tool], [tool, {**tool, "content": content + " again"}],
                 [tool, {"role": "user", "content": "next " + content}]]
    return runs


def both_ways(renderer: TemplateRenderer, previous: dict[str, Any],
              appended: list[dict[str, Any]]) -> tuple[Any, Any]:
    """(the bridge with skeletons, the bridge rendered by the template), or the
    exception each raised."""
    def bridge() -> Any:
        try:
            return renderer.bridge(previous, renderer.primary_stop_id, appended)
        except Exception as exc:
            return type(exc), str(exc)

    saved = renderer.skeletons
    fast = bridge()
    renderer.skeletons = None
    try:
        slow = bridge()
    finally:
        renderer.skeletons = saved
    return fast, slow


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - set(ALIASES)))
def test_skeletons_give_the_template_render_for_every_family(family: str) -> None:
    renderer = renderer_of(family)
    for previous in PREVIOUS:
        for content in CONTENTS:
            for appended in appended_runs(previous, content):
                if not {m["role"] for m in appended} <= renderer.allowed_append_roles:
                    continue
                for _ in range(3):  # rendered, then a skeleton built, then reused
                    fast, slow = both_ways(renderer, previous, appended)
                    assert fast == slow, (family, previous, appended)


def test_chatml_families_use_skeletons() -> None:
    """Guards the test above against passing with the fast path never taken."""
    used = []
    for family in ("qwen3", "chatml", "glm47"):
        renderer = renderer_of(family)
        assert renderer.skeletons is not None
        for _ in range(2):  # a skeleton is built on its slot's second use
            renderer.bridge(PREVIOUS[0], renderer.primary_stop_id,
                            [{"role": "user", "content": "hello"}])
        used.append(any(s is not None for s in renderer.skeletons.values()))
    assert all(used)


def test_opaque_contents() -> None:
    assert opaque("a b\nc") and opaque('{"x": [1]}') and opaque("中文")
    for bad in ("", " a", "a ", "a\n", "<x>", "a\ue000b", None, ["a"]):
        assert not opaque(bad)


def test_shape_keys_fields_the_render_reads() -> None:
    tool = {"role": "tool", "content": "x", "tool_call_id": "c1"}
    assert shape_of([tool], frozenset()) == shape_of([{**tool, "tool_call_id": "c2"}],
                                                     frozenset())
    assert shape_of([tool], frozenset({"tool_call_id"})) != shape_of(
        [{**tool, "tool_call_id": "c2"}], frozenset({"tool_call_id"}))
    assert shape_of([{**tool, "extra": 1}], frozenset()) is None
    assert shape_of([{**tool, "content": " x"}], frozenset()) is None


def test_escaping_or_rewriting_templates_get_no_skeleton() -> None:
    import json

    def escaping(messages: list[dict[str, Any]]) -> str:
        return "".join(json.dumps(m["content"]) for m in messages)

    def splitting(messages: list[dict[str, Any]]) -> str:
        return "".join(m["content"][:3] for m in messages)

    def verbatim(messages: list[dict[str, Any]]) -> str:
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)

    msgs = [{"role": "tool", "content": "x"}, {"role": "user", "content": "y"}]
    assert build_skeleton(escaping, msgs) is None
    assert build_skeleton(splitting, msgs) is None
    skeleton = build_skeleton(verbatim, msgs)
    assert skeleton is not None
    assert skeleton.fill(["a", "b"]) == "<tool>a</tool><user>b</user>"


@settings(max_examples=examples(60), deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_any_content_gives_the_template_render(content: str) -> None:
    renderer = renderer_of("qwen3")
    fast, slow = both_ways(renderer, PREVIOUS[1], [
        {"role": "tool", "content": content, "tool_call_id": "call_1"}])
    assert fast == slow


def test_a_skeleton_is_built_on_its_second_use_only() -> None:
    """An agent that calls tools gives every bridge a new base (the previous turn's calls):
    its first use renders once, without the two renders that build a skeleton."""
    renderer = renderer_of("qwen3")
    assert renderer.skeletons is not None
    previous = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_once", "type": "function",
         "function": {"name": "once", "arguments": '{"n": 1}'}}]}  # a base key of its own
    appended = [{"role": "tool", "tool_call_id": "call_once", "content": "hello"}]
    saved, renderer.standins = renderer.standins, None  # the real calls' base, every time
    try:
        known = len(renderer.skeletons)
        renderer.bridge(previous, renderer.primary_stop_id, appended)
        assert len(renderer.skeletons) == known
        renderer.bridge(previous, renderer.primary_stop_id, appended)
        assert len(renderer.skeletons) == known + 1
    finally:
        renderer.standins = saved
