"""Decoding a Messages body past the session's last one gives what decoding it whole gives
(request, turn, errors), with the earlier messages' conversions reused."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from tito.render.base import TemplateRenderer
from tito.server.anthropic.decode import LastBody, decode_messages
from tito.server.api_state import ApiState
from tito.types.errors import BadRequest

TEXT = "the quick brown fox jumps over the lazy dog "


def body(messages: list[dict[str, Any]], **rest: Any) -> bytes:
    return orjson.dumps({"model": "m", "max_tokens": 64, "messages": messages, **rest})


def assistant(k: int) -> dict[str, Any]:
    return {"role": "assistant", "content": [
        {"type": "thinking", "thinking": f"plan {k}", "signature": "sig"},
        {"type": "text", "text": TEXT + str(k)},
        {"type": "tool_use", "id": f"toolu_{k}", "name": "bash", "input": {"cmd": f"ls {k}"}}]}


def tool_result(k: int) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": TEXT * 2},
        {"type": "text", "text": f"and then {k}"}]}


def whole(raw: bytes, renderer: TemplateRenderer) -> tuple[Any, Any]:
    try:
        req, turn = decode_messages(raw, renderer, max_depth=64)
    except BadRequest as exc:
        return "error", exc.message
    return req.model_dump(), (turn.messages, turn.tools, turn.template_kwargs)


def incremental(raw: bytes, renderer: TemplateRenderer, state: ApiState,
                known: list[dict[str, Any]] | None = None) -> tuple[Any, Any]:
    try:
        req, turn = decode_messages(raw, renderer, max_depth=64, state=state,
                                    stored=known)
    except BadRequest as exc:
        return "error", exc.message
    return req.model_dump(), (turn.messages, turn.tools, turn.template_kwargs)


def test_a_growing_history_decodes_as_whole_and_reuses_the_earlier_conversions(
        qwen3_renderer: TemplateRenderer) -> None:
    state = ApiState()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    rest = {"system": [{"type": "text", "text": "be brief"}], "thinking": {"type": "enabled"},
            "tools": [{"name": "bash", "input_schema": {"type": "object"}}]}
    previous: LastBody | None = None
    for k in range(6):
        raw = body(messages, **rest)
        assert incremental(raw, qwen3_renderer, state) == whole(raw, qwen3_renderer)
        last: LastBody = state.messages_body
        if previous is not None:  # the earlier messages were not converted again
            kept = len(previous.chat)
            assert all(a is b for a, b in zip(last.chat[:kept], previous.chat, strict=True))
            assert last.rest is previous.rest
        # the state keeps placeholders, not the parsed messages
        assert last.parsed is not None and set(last.parsed.items) == {None}
        assert last.request.messages == []
        previous = last
        messages += [assistant(k), tool_result(k)]


def test_the_stored_messages_replace_the_same_json(qwen3_renderer: TemplateRenderer) -> None:
    """The assistant reply the client sends back becomes the session's stored object."""
    state = ApiState()
    first = [{"role": "user", "content": "start"}]
    _, turn = decode_messages(body(first), qwen3_renderer, max_depth=64, state=state)
    stored_reply = {"role": "assistant", "content": TEXT + "0", "reasoning_content": "plan 0",
                    "tool_calls": [{"id": "toolu_0", "type": "function", "function": {
                        "name": "bash", "arguments": '{"cmd": "ls 0"}'}}]}
    known = [*turn.messages, stored_reply]
    raw = body([*first, assistant(0), tool_result(0)])
    _, turn = decode_messages(raw, qwen3_renderer, max_depth=64, state=state, stored=known)
    assert turn.messages[0] is known[0]  # the first turn's own object
    assert turn.messages[1] is stored_reply
    assert turn.messages[2] == {"role": "tool", "tool_call_id": "toolu_0", "content": TEXT * 2}
    # a reply that differs is left as the client sent it
    other = {**stored_reply, "content": "something else"}
    state = ApiState()
    decode_messages(body(first), qwen3_renderer, max_depth=64, state=state)
    _, turn = decode_messages(raw, qwen3_renderer, max_depth=64, state=state,
                              stored=[known[0], other])
    assert turn.messages[1] is not other and turn.messages[1] == stored_reply


@pytest.mark.parametrize("seed", range(12))
def test_random_edits_decode_as_whole(qwen3_renderer: TemplateRenderer, seed: int) -> None:
    """Appends, changed members, rewritten or invalid messages, in any order: the result
    (or the error) is always that of decoding the body whole, and a failed body leaves the
    state as it was."""
    rng = random.Random(seed)
    state = ApiState()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    rest: dict[str, Any] = {"system": "be brief"}
    for k in range(25):
        candidate = list(messages)
        step = rng.choice(["append", "append", "append", "rest", "rewrite", "bad", "deep"])
        if step == "append":
            candidate += [assistant(k), tool_result(k)]
        elif step == "rest":
            rest = rng.choice([{"system": "be brief"}, {"system": "be long", "top_k": 5},
                               {"thinking": {"type": "disabled"}}, {}, {"max_tokens": 9}])
        elif step == "rewrite" and len(candidate) > 1:
            candidate[rng.randrange(len(candidate))] = {"role": "user", "content": f"x{k}"}
        elif step == "bad":
            candidate.append(rng.choice([
                {"role": "user", "content": [{"type": "image", "source": {}}]},
                {"role": "user", "content": 5}, {"role": "robot", "content": "hi"},
                {"role": "user", "content": ["not a block"]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": 1}]}]))
        else:
            nested: Any = "leaf"
            for _ in range(70):
                nested = [nested]
            candidate.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "x", "extra": nested}]})
        raw = body(candidate, **rest)
        before = state.messages_body
        got = incremental(raw, qwen3_renderer, state)
        assert got == whole(raw, qwen3_renderer), (seed, k, step)
        if got[0] == "error":
            assert state.messages_body is before
        else:
            messages = candidate


def test_a_replayed_session_shares_its_stored_system_and_messages(
        qwen3_renderer: TemplateRenderer) -> None:
    """No state yet (a restarted gateway): the stored messages still replace their copies."""
    first = [{"role": "user", "content": "start"}]
    raw = body([*first, assistant(0), tool_result(0)], system="be brief")
    _, turn = decode_messages(raw, qwen3_renderer, max_depth=64)
    known = [dict(m) for m in turn.messages[:3]]  # as a journal replay rebuilds them
    _, shared = decode_messages(raw, qwen3_renderer, max_depth=64, state=ApiState(), stored=known)
    assert all(a is b for a, b in zip(shared.messages, known, strict=False))
    assert shared.messages == turn.messages


def test_a_block_that_is_not_an_object_is_named(qwen3_renderer: TemplateRenderer) -> None:
    raw = body([{"role": "user", "content": ["hello"]}])
    with pytest.raises(BadRequest, match=r"messages\.0\.content\.0: a content block must be "
                                         "an object"):
        decode_messages(raw, qwen3_renderer, max_depth=64)


DEFERRED = {"name": "lookup", "input_schema": {"type": "object"}, "defer_loading": True}


def searched(k: int) -> dict[str, Any]:
    """A tool result of tool references (and an image), then a user text."""
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": [
            {"type": "tool_reference", "tool_name": "lookup"},
            {"type": "image", "source": {"type": "base64", "data": "AA=="}}]},
        {"type": "text", "text": f"and then {k}"}]}


@pytest.mark.parametrize("seed", range(8))
def test_tool_references_and_images_decode_as_whole(qwen3_renderer: TemplateRenderer,
                                                     seed: int) -> None:
    """References render the tools of the body they are in: a body whose declared tools
    changed is decoded whole, and the images replaced are counted over every message."""
    rng = random.Random(seed)
    state = ApiState()
    policy = {"images": "placeholder", "hosted_tools": "drop"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    tools: list[dict[str, Any]] = [{"name": "bash", "input_schema": {"type": "object"}},
                                   DEFERRED]
    for k in range(14):
        candidate = list(messages)
        step = rng.choice(["append", "append", "tools", "drop", "hosted"])
        if step == "append":
            candidate += [assistant(k), searched(k)]
        elif step == "tools":
            tools = [tools[0], {**DEFERRED, "description": f"version {k}"}]
        elif step == "drop":
            tools = [tools[0]]  # the references now name an undeclared tool: 400
        else:
            tools = [*tools, {"type": "web_search_20250305", "name": "web_search"}]
        raw = body(candidate, tools=tools)
        try:
            expected: Any = decode_messages(raw, qwen3_renderer, max_depth=64, **policy)
        except BadRequest as exc:
            expected = exc.message
        before = state.messages_body
        try:
            got: Any = decode_messages(raw, qwen3_renderer, max_depth=64, state=state,
                                       **policy)
        except BadRequest as exc:
            got = exc.message
        if isinstance(expected, str):
            assert got == expected and state.messages_body is before, (seed, k, step)
            tools = [tools[0], DEFERRED]
            continue
        assert got[1] == expected[1], (seed, k, step)
        images = sum(m is not candidate[0] and m["role"] == "user"
                     and isinstance(m["content"], list) for m in candidate)
        assert (got[1].notes or {}).get("images_replaced", 0) == images
        assert got[1].tools == [{"type": "function", "function": {
            "name": "bash", "parameters": {"type": "object"}}}]
        messages = candidate


def test_a_tool_reference_renders_the_tool_as_declared(qwen3_renderer: TemplateRenderer
                                                        ) -> None:
    raw = body([{"role": "user", "content": "start"}, assistant(0), searched(0)],
               tools=[DEFERRED])
    _, turn = decode_messages(raw, qwen3_renderer, max_depth=64, images="placeholder")
    assert turn.tools is None  # the only tool is deferred
    assert turn.messages[2] == {"role": "tool", "tool_call_id": "toolu_0", "content": (
        '<tools>\n{"type": "function", "function": {"name": "lookup", "parameters": '
        '{"type": "object"}}}\n</tools>\n[image]')}
    with pytest.raises(BadRequest, match=r"messages\.2\.content\.0\.content\.1 is an image"):
        decode_messages(raw, qwen3_renderer, max_depth=64)


@pytest.mark.parametrize("appended", [0, 2])
@pytest.mark.parametrize("same_rest", [True, False])
def test_a_second_body_reuses_the_first_one_s_system_and_tools(
        qwen3_renderer: TemplateRenderer, appended: int, same_rest: bool) -> None:
    """A session's first body has one message, which Claude Code sends back rewritten (its
    ``cache_control`` marker moved on): the second body is matched to its messages'
    ``[``, so with the same members after the array its system prompt and tools are the
    first body's, decoded as whole either way."""
    state = ApiState()
    tools = [{"name": f"tool{k}", "description": TEXT, "input_schema": {
        "type": "object", "properties": {"cmd": {"type": "string"}}}} for k in range(3)]
    rest = {"system": [{"type": "text", "text": "be brief",
                        "cache_control": {"type": "ephemeral"}}], "tools": tools}
    first = [{"role": "user", "content": [{"type": "text", "text": "start",
                                           "cache_control": {"type": "ephemeral"}}]}]
    raw = body(first, **rest)
    assert incremental(raw, qwen3_renderer, state) == whole(raw, qwen3_renderer)
    previous: LastBody = state.messages_body
    later = [{"role": "user", "content": [{"type": "text", "text": "start"}]},
             assistant(0), tool_result(0)][:1 + appended]
    later[-1] = {**later[-1], "content": [*later[-1]["content"][:-1], {
        **later[-1]["content"][-1], "cache_control": {"type": "ephemeral"}}]}
    raw = body(later, **(rest if same_rest else {**rest, "temperature": 0.5}))
    assert incremental(raw, qwen3_renderer, state) == whole(raw, qwen3_renderer)
    last: LastBody = state.messages_body
    assert (last.rest is previous.rest) == same_rest
    assert (last.request is previous.request) == same_rest
    empty = body([], **rest)  # no message: the whole decode's error
    assert incremental(empty, qwen3_renderer, state) == whole(empty, qwen3_renderer)
    assert whole(empty, qwen3_renderer)[0] == "error"


def test_a_moving_cache_control_marker_reconverts_only_the_last_message(
        qwen3_renderer: TemplateRenderer) -> None:
    """Claude Code marks its newest message with ``cache_control`` and unmarks the one it
    marked the turn before: the body is decoded past the message before that one, with
    what a whole decode gives."""
    state = ApiState()
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": "start"}]}]
    previous: LastBody | None = None
    for k in range(6):
        sent = [dict(m) for m in messages]
        blocks = [dict(b) for b in sent[-1]["content"]]
        blocks[-1]["cache_control"] = {"type": "ephemeral"}
        sent[-1]["content"] = blocks
        raw = orjson.dumps({"model": "m", "messages": sent, "max_tokens": 64,
                            "system": [{"type": "text", "text": "be brief",
                                        "cache_control": {"type": "ephemeral"}}]})
        assert incremental(raw, qwen3_renderer, state) == whole(raw, qwen3_renderer)
        last: LastBody = state.messages_body
        if k >= 2 and previous is not None:  # all but the previous last message's reused
            kept = previous.last_chat
            assert kept > 0
            assert all(a is b for a, b in zip(last.chat[:kept], previous.chat[:kept],
                                              strict=True))
            assert last.chat[kept] is not previous.chat[kept]
        previous = last
        messages += [assistant(k), tool_result(k)]
