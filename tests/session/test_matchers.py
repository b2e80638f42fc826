"""Replay matchers: accept and reject cases, monotonic match sets, user matchers."""

from __future__ import annotations

import sys
import types

import pytest

from tito.session.matchers import (
    MatcherError,
    loose_tool_call,
    resolve_matcher,
    role_content_only,
    strict,
)
from tito.types.errors import ConfigError


def call(args: object, **extra: object) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args},
            **extra}


def msg(content: object = "x", **kw: object) -> dict:
    return {"role": "assistant", "content": content, **kw}


CASES = [
    # (stored, replayed, strict, loose, role_content_only)
    (msg(None), msg(""), True, True, True),
    (msg(""), msg([]), True, True, True),
    (msg("a"), msg([{"type": "text", "text": "a"}]), True, True, True),
    (msg("a", provider_specific={"x": 1}), msg("a"), True, True, True),
    (msg("", tool_calls=[call('{"a": 1}')]), msg("", tool_calls=[call('{"a": 1}', index=0)]),
     True, True, True),
    (msg("", tool_calls=[call('{"a": 1}')]), msg("", tool_calls=[call('{"a":1}')]),
     False, True, True),
    (msg("", tool_calls=[call('{"a": 1, "b": 2}')]),
     msg("", tool_calls=[call('{"b": 2, "a": 1.0}')]), False, True, True),
    (msg("", tool_calls=[call("")]), msg("", tool_calls=[call("{}")]), False, True, True),
    (msg("", tool_calls=[call(None)]), msg("", tool_calls=[call("{ }")]), False, True, True),
    (msg("", tool_calls=[call('{"a": true}')]), msg("", tool_calls=[call('{"a": 1}')]),
     False, False, True),
    (msg("", tool_calls=[call('{"a": null}')]), msg("", tool_calls=[call('{"a": "null"}')]),
     False, False, True),
    (msg("", tool_calls=[call('{"a": 1, "a": 1}')]), msg("", tool_calls=[call('{"a": 1}')]),
     False, False, True),
    (msg("", tool_calls=[call("[1]")]), msg("", tool_calls=[call("[1]")]), True, True, True),
    (msg("a", reasoning_content="r"), msg("a"), False, False, True),
    (msg("a"), msg("b"), False, False, False),
    (msg("a"), {"role": "user", "content": "a"}, False, False, False),
    (msg("", tool_calls=[call("{}")]), msg("", tool_calls=[{**call("{}"), "id": "c2"}]),
     False, False, True),
]


@pytest.mark.parametrize("stored,replayed,s,lo,rc", CASES)
def test_matchers(stored: dict, replayed: dict, s: bool, lo: bool, rc: bool) -> None:
    assert strict(stored, replayed) is s
    assert loose_tool_call(stored, replayed) is lo
    assert role_content_only(stored, replayed) is rc
    assert (not s or lo) and (not lo or rc)  # monotonic


def test_matchers_do_not_mutate() -> None:
    a, b = msg("", tool_calls=[call('{"a": 1}')]), msg("", tool_calls=[call('{"a":1}', index=3)])
    snapshot = (repr(a), repr(b))
    loose_tool_call(a, b)
    assert (repr(a), repr(b)) == snapshot


def test_resolve_builtin_and_dotted(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_matcher("strict") is strict
    for bad in ("Strict", "LOOSE_TOOL_CALL", "role-content-only"):
        with pytest.raises(ConfigError):
            resolve_matcher(bad)
    mod = types.ModuleType("user_matchers_mod")
    mod.always = lambda a, b: True  # type: ignore[attr-defined]
    mod.broken = lambda a, b: 1  # type: ignore[attr-defined]

    async def asyncm(a: dict, b: dict) -> bool:
        return True

    mod.asyncm = asyncm  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "user_matchers_mod", mod)
    assert resolve_matcher("user_matchers_mod:always")(msg("a"), msg("b")) is True
    with pytest.raises(MatcherError, match="must return bool"):
        resolve_matcher("user_matchers_mod.broken")(msg("a"), msg("b"))
    with pytest.raises(ConfigError, match="not async"):
        resolve_matcher("user_matchers_mod:asyncm")
    with pytest.raises(ConfigError, match="cannot load"):
        resolve_matcher("no_such_module_xyz:f")


# -- the harness matcher ----------------------------------------------------------------
THINKING = msg("It is 21°C.", reasoning_content="The tool said 21.")
CALLING = msg("", reasoning_content="Call it.", tool_calls=[call('{"city": "Paris"}')])

HARNESS_CASES = [
    # (stored, replayed, what is tolerated (None: not the same message))
    (THINKING, THINKING, []),
    (THINKING, msg("It is 21°C."), ["reasoning_dropped"]),
    (THINKING, msg("It is 21°C.", reasoning_content=None), ["reasoning_dropped"]),
    (THINKING, msg("<think>\nThe tool said 21.\n</think>\n\nIt is 21°C."),
     ["reasoning_in_content"]),
    (THINKING, msg("<think>Something else</think>It is 21°C."), None),
    (THINKING, msg("It is 22°C."), None),
    (THINKING, msg("It is 21°C.", reasoning_content="Other reasoning."), None),
    (CALLING, msg(None, tool_calls=[call('{"city":"Paris"}')]),
     ["reasoning_dropped", "arguments_reformatted"]),
    (CALLING, msg("", reasoning_content="Call it.",
                  tool_calls=[{**call('{"city": "Paris"}'), "id": "call_9"}]),
     ["call_id_changed"]),
    (CALLING, msg("", reasoning_content="Call it.",
                  tool_calls=[{k: v for k, v in call('{"city": "Paris"}').items()
                               if k != "type"}]), []),
    (CALLING, msg("", reasoning_content="Call it.", tool_calls=[call('{"city": "Rome"}')]),
     None),
    (CALLING, msg("Action: f(city=Paris)"), None),
    (msg("a"), {"role": "user", "content": "a"}, None),
]


@pytest.mark.parametrize("stored,replayed,kinds", HARNESS_CASES)
def test_the_harness_matcher_names_what_it_tolerates(stored: dict, replayed: dict,
                                                      kinds: list[str] | None) -> None:
    from tito.session.matchers import harness_matcher, tolerated

    found = tolerated(stored, replayed, call_ids_rendered=False)
    assert (sorted(found) if found is not None else None) == \
        (sorted(kinds) if kinds is not None else None)
    assert harness_matcher(False)(stored, replayed) is (kinds is not None)
    # a family that renders call ids keeps them; everything else alike
    with_ids = tolerated(stored, replayed, call_ids_rendered=True)
    assert with_ids == (None if kinds is None or "call_id_changed" in kinds else found)


@pytest.mark.parametrize("stored,replayed,s,lo,rc", CASES)
def test_harness_contains_loose_tool_call(stored: dict, replayed: dict, s: bool, lo: bool,
                                          rc: bool) -> None:
    from tito.session.matchers import harness

    assert not lo or harness(stored, replayed)


def test_differing_fields_name_the_message_fields() -> None:
    from tito.session.matchers import differing_fields

    assert differing_fields(CALLING, CALLING) == []
    assert differing_fields(CALLING, msg("Action: f")) == [
        "content", "reasoning_content", "tool_calls"]
    assert differing_fields(CALLING, msg("", reasoning_content="Call it.", tool_calls=[
        {**call('{"city":"Paris"}'), "id": "c9"}])) == [
        "tool_calls[0].function.arguments", "tool_calls[0].id"]


def test_harness_is_the_default_and_knows_the_family() -> None:
    from tito.config import ServerConfig
    from tito.session.matchers import DEFAULT, harness

    assert ServerConfig(tokenizer="").message_matcher == DEFAULT == "harness"
    assert resolve_matcher("harness") is harness
    assert resolve_matcher("harness", call_ids_rendered=False).call_ids_rendered is False
