"""parse_growing: exactly orjson.loads, in O(new bytes) when a body extends the previous."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from helpers.support import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from tito.server.api_state import ApiState
from tito.server.growing_body import (
    ESTABLISH_MISSES,
    GrowingBody,
    _establish,
    _establish_compact,
    _establish_walked,
    parse_growing,
    same_json,
    share,
    share_stored,
    without_elements,
)

KEY = "messages"
MARK = {"cache_control": {"type": "ephemeral"}}


def same_as_orjson(body: bytes, state: GrowingBody | None, *, short: bool = False
                   ) -> tuple[Any, GrowingBody | None, int]:
    """parse_growing(body) next to orjson.loads(body): same value (key order included) or
    the same error."""
    try:
        want = orjson.loads(body)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            parse_growing(body, KEY, state, short=short)
        return None, state, -1
    got = parse_growing(body, KEY, state, short=short)
    assert got.data == want
    assert type(got.data) is type(want)
    if isinstance(want, dict):
        assert list(got.data) == list(want)
    return got.data, got.state, got.extended


def dumps(obj: Any, style: int) -> bytes:
    if style == 0:
        return orjson.dumps(obj)
    if style == 1:  # the OpenAI SDK's httpx: json.dumps defaults
        return json.dumps(obj).encode()
    if style == 2:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    return json.dumps(obj, indent=1).encode()


def sdk_body(messages: list[dict[str, Any]], **rest: Any) -> bytes:
    return json.dumps({"messages": messages, **rest}).encode()


def test_a_growing_history_is_parsed_from_the_previous_body() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi é \u2028 \"q\""}]
    state = None
    extended = []
    for turn in range(6):
        _, state, n = same_as_orjson(sdk_body(messages, model="m", max_tokens=8), state)
        extended.append(n)
        messages += [{"role": "assistant", "content": f"a{turn}"},
                     {"role": "tool", "content": "x" * turn, "tool_call_id": str(turn)}]
    assert extended == [0, 1, 3, 5, 7, 9]


def test_the_state_keeps_a_digest_of_the_head_not_its_bytes() -> None:
    body = sdk_body([{"role": "user", "content": "a"}], model="m")
    state = parse_growing(body, KEY, None).state
    assert state is not None and body[:state.head].endswith(b'"a"}')
    other = body[:state.head].replace(b'"a"', b'"b"') + body[state.head:]
    assert len(other) == len(body)  # same length, other bytes: not extended
    assert parse_growing(other, KEY, state).extended == 0


def test_the_earlier_elements_are_last_turns_objects_and_the_rest_is_fresh() -> None:
    first = parse_growing(sdk_body([{"role": "user", "content": "a"}], model="m"), KEY, None)
    second = parse_growing(sdk_body([{"role": "user", "content": "a"},
                                     {"role": "user", "content": "b"}], model="m"),
                           KEY, first.state)
    assert second.extended == 1 and second.same_rest
    assert second.data[KEY][0] is first.data[KEY][0]
    assert second.data[KEY] is not first.data[KEY]  # the caller's list is its own
    second.data[KEY].append("mutated")
    second.data["model"] = "mutated"
    third = parse_growing(sdk_body([{"role": "user", "content": "a"},
                                    {"role": "user", "content": "b"}], model="m"),
                          KEY, second.state)
    assert third.data == {KEY: [{"role": "user", "content": "a"},
                                {"role": "user", "content": "b"}], "model": "m"}


def test_other_members_may_change_and_come_before_the_array() -> None:
    base = [{"role": "user", "content": "a"}]
    first = parse_growing(json.dumps({"model": "m", KEY: base, "max_tokens": 5}).encode(),
                          KEY, None)
    body = json.dumps({"model": "m", KEY: [*base, {"role": "user", "content": "b"}],
                       "max_tokens": 9, "stream": False}).encode()
    second = parse_growing(body, KEY, first.state)
    assert second.extended == 1 and not second.same_rest
    assert second.data == orjson.loads(body) and list(second.data) == list(orjson.loads(body))


def prefix_state() -> tuple[bytes, GrowingBody]:
    body = sdk_body([{"role": "user", "content": "a"}], model="m")
    parsed = parse_growing(body, KEY, None)
    assert parsed.state is not None
    return body[:parsed.state.head], parsed.state


@pytest.mark.parametrize("rest", [
    b"]}",
    b' , {"role": "user"}]}',
    b', {"role": "user"},]}',  # trailing comma in the array
    b', {"role": "user"}], }',  # trailing comma in the object
    b', {"role": "user"}],}',
    b', NaN], "model": "m"}',
    b', "\\ud800"], "model": "m"}',  # a lone surrogate: orjson refuses it
    b', "\xff"], "model": "m"}',  # invalid UTF-8
    b', 1e400], "model": "m"}',
    b', 123456789012345678901234567890], "model": "m"}',
    b', {"a": 1, "a": 2}], "model": "m"}',  # a duplicate inside an element is orjson's
    b', {"role": "user"}], "model": "m", "messages": []}',  # the array again
    b', {"role": "user"}], "model": "m", "\\u006dessages": []}',  # escaped
    b', {"role": "user"}], "model": "n"}',
    b', {"role": "user"}], "model": "m"} extra',
    b', {"role": "user"}], "model": "m"}\n  ',
    b', {"role": "user"}], "model": "m"',  # truncated
    b', {"role": "user"}',
    b', [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]], "model": "m"}',
    b' ] ,"model":"m"}',
    b',], "model": "m"}',
    b', ], "model": "m"}',
    b',, {}], "model": "m"}',
    b', {"a": "], \\"model\\": \\"m\\"}"}], "model": "m"}',  # the tail inside a string
    b', "x"] ], "model": "m"}',
    b', {"b": [1, 2], "model": "m"}',
    b'] , "x": 1, "model": "m"}',
])
def test_anything_after_the_known_head_parses_as_orjson_does(rest: bytes) -> None:
    head, state = prefix_state()
    same_as_orjson(head + rest, state)


def opening_state(style: int = 2) -> tuple[bytes, GrowingBody]:
    """A one-element body's state and its bytes through the array's ``[`` (its short
    head)."""
    body = dumps({"model": "m", KEY: [{"role": "user", "content": "a"}], "n": 1}, style)
    state = parse_growing(body, KEY, None, short=True).state
    assert state is not None and body[:state.short].endswith(b"[")
    return body[:state.short], state


@pytest.mark.parametrize("rest", [
    b']}',
    b' ], "n": 1}',
    b'{"role": "user"}], "n": 1}',
    b'  {"role": "user"} , {"b": 2} ], "n": 1}',
    b'{"role": "user"}, {"b": 2}, 3], "n": 2, "x": []}',
    b'{"role": "user"}], "n": 1, "model": "o"}',  # a member before the array again
    b'{"role": "user"}], "n": 1, "messages": []}',  # the array again
    b', {"role": "user"}], "n": 1}',  # a comma before the first element
    b',], "n": 1}',
    b'{"role": "user"},], "n": 1}',  # trailing comma in the array
    b'{"role": "user"}], "n": 1,}',
    b'{"role": "user"} {"b": 2}], "n": 1}',  # no comma between elements
    b'"\\ud800"], "n": 1}',
    b'"\xff"], "n": 1}',
    b'NaN], "n": 1}',
    b'{"role": "user"}], "n": 1',  # truncated
    b'{"role": "user"}',
    b'{"role": "user"}], "n": 1} extra',
    b'[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]], "n": 1}',
    b'"], \\"n\\": 1}"], "n": 1}',  # the tail inside a string
])
@pytest.mark.parametrize("style", [0, 1])
def test_anything_after_a_one_element_body_s_opening_parses_as_orjson_does(
        rest: bytes, style: int) -> None:
    """``short``: a body that rewrites the only element of the last one is matched up to
    the array's ``[`` (every element parsed as new), exactly as ``orjson`` parses it."""
    head, state = opening_state(style)
    same_as_orjson(head + rest, state, short=True)


@pytest.mark.parametrize("style", range(4))
def test_a_one_element_body_s_rewrite_is_parsed_from_the_opening_with_the_same_rest(
        style: int) -> None:
    """Claude Code's second body: the first (only) message comes back rewritten, with
    new ones after it, and the members after the array (system prompt, tools) are the
    first body's: they are not parsed again, and the state grows from there."""
    rest = {"system": "s" * 50, "tools": [{"name": "t", "input_schema": {}}]}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "a"}]
    state: GrowingBody | None = None
    got = []
    for turn in range(4):
        raw = dumps({"model": "m", KEY: marked(messages), **rest}, style)
        parsed = parse_growing(raw, KEY, state, short=True)
        assert parsed.data == orjson.loads(raw) and list(parsed.data) == list(orjson.loads(raw))
        got.append((parsed.extended, parsed.same_rest))
        state = parsed.state
        messages += [{"role": "assistant", "content": f"r{turn}"},
                     {"role": "user", "content": f"u{turn}"}]
    assert got == [(0, False), (0, True), (2, True), (4, True)]


def test_a_member_before_the_array_repeated_after_it_is_orjsons_choice() -> None:
    first = parse_growing(b'{"model": "m", "messages": [1]}', KEY, None)
    body = b'{"model": "m", "messages": [1, 2], "model": "n"}'
    got = parse_growing(body, KEY, first.state)
    assert got.data == orjson.loads(body) == {"model": "n", "messages": [1, 2]}


@pytest.mark.parametrize("body", [
    b'{"messages": [1], "messages": [2]}',  # duplicate member: no state
    b'{"messages": []}',
    b'{"messages": "x"}',
    b'[1, 2]',
    b'{"other": [1]}',
])
def test_bodies_without_a_growing_array_keep_no_state(body: bytes) -> None:
    parsed = parse_growing(body, KEY, None)
    assert parsed.data == orjson.loads(body) and parsed.state is None


def test_a_rewritten_history_is_parsed_whole_and_becomes_the_state() -> None:
    first = parse_growing(sdk_body([{"role": "user", "content": "a"}, {"role": "user",
                                                                      "content": "b"}]),
                          KEY, None)
    rolled = sdk_body([{"role": "user", "content": "a"}, {"role": "user", "content": "c"}])
    second = parse_growing(rolled, KEY, first.state)
    assert second.extended == 0 and second.data == orjson.loads(rolled)
    third = parse_growing(sdk_body([{"role": "user", "content": "a"},
                                    {"role": "user", "content": "c"}, {"role": "user"}]),
                          KEY, second.state)
    assert third.extended == 2


_text = st.text(st.characters(codec="utf-8"), max_size=12)
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                    st.floats(allow_nan=False, allow_infinity=False), _text)
_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(_text, inner, max_size=3), max_leaves=8)
_message = st.dictionaries(_text, _value, max_size=4)


@settings(max_examples=examples(300), deadline=None)
@given(first=st.lists(_message, min_size=1, max_size=3),
       steps=st.lists(st.tuples(st.integers(0, 3), st.lists(_message, max_size=3),
                                st.dictionaries(st.sampled_from(["model", "n", "x", "é"]),
                                                _value, max_size=2),
                                st.integers(0, 3), st.booleans()), max_size=6),
       before=st.booleans())
def test_any_sequence_of_bodies_parses_as_orjson_does(
        first: list[Any], steps: list[tuple[int, list[Any], dict[str, Any], int, bool]],
        before: bool) -> None:
    messages = list(first)
    state: GrowingBody | None = None
    last: tuple[int, bool, dict[str, Any], int] | None = None
    for drop, appended, rest, style, lead in [(0, [], {}, 0, before), *steps]:
        if drop:
            messages = messages[:-drop] or messages[:1]
        messages += appended
        obj = {**rest, KEY: messages} if lead else {KEY: messages, **rest}
        known = state is not None and bool(state.head)  # not backing off after misses
        _, state, extended = same_as_orjson(dumps(obj, style), state)
        if known and last is not None and not drop and last[:2] == (style, lead) \
                and (not lead or dumps(rest, style) == dumps(last[2], style)):
            assert extended == last[3]  # the same serializer extended the same history
        last = (style, lead, rest, len(messages))


@settings(max_examples=examples(300), deadline=None)
@given(first=st.lists(_message, min_size=1, max_size=2),
       steps=st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.lists(_message, max_size=3),
                                st.dictionaries(st.sampled_from(["model", "n", "x"]), _value,
                                                max_size=2)), max_size=5),
       style=st.integers(0, 3), lead=st.booleans())
def test_any_sequence_of_rewrites_of_the_last_element_parses_as_orjson_does(
        first: list[Any], steps: list[tuple[bool, int, list[Any], dict[str, Any]]],
        style: int, lead: bool) -> None:
    """``short``: bodies that rewrite, drop or keep their last element (one-element arrays
    included: matched to the ``[``) and append others parse as ``orjson`` does."""
    messages = list(first)
    state: GrowingBody | None = None
    for rewrite, drop, appended, rest in [(False, 0, [], {}), *steps]:
        if drop:
            messages = messages[:-drop] or messages[:1]
        if rewrite:
            messages = [*messages[:-1], {"rewritten": messages[-1]}]
        messages += appended
        obj = {**rest, KEY: messages} if lead else {KEY: messages, **rest}
        _, state, _ = same_as_orjson(dumps(obj, style), state, short=True)


def test_a_client_that_rewrites_its_history_every_turn_stops_paying_for_the_state() -> None:
    state: GrowingBody | None = None
    established = []
    for turn in range(18):  # the first message changes every turn: nothing ever extends
        body = sdk_body([{"role": "user", "content": f"v{turn}"}, {"role": "user"}])
        _, state, extended = same_as_orjson(body, state)
        assert extended == 0 and state is not None
        established.append(bool(state.head))
    assert established == [True, True, True] + [False] * 5 + [True] + [False] * 7 + [True] \
        + [False]
    assert state.misses == 17
    grown = parse_growing(sdk_body([{"role": "user", "content": "v16"}, {"role": "user"},
                                    {"role": "user"}]), KEY, None)
    assert grown.state is not None and grown.state.misses == 0


@pytest.mark.parametrize(("a", "b", "same"), [
    ({"a": 1, "b": [1.5, None, True]}, {"a": 1, "b": [1.5, None, True]}, True),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}, False),  # equal dicts, another key order
    ([1], [1.0], False),  # 1 == 1.0
    ([0.0], [-0.0], False),  # 0.0 == -0.0
    ([True], [1], False),  # True == 1
    ({"a": [{"b": "x"}]}, {"a": [{"b": "y"}]}, False),
    ({"a": [1, 2]}, {"a": [1, 2, 3]}, False),
    ({"a": 1}, {"a": 1, "b": 2}, False),
    ("é", "é", True),
    ([[1]], [(1,)], False),  # a tuple is written as an array, but is not a list
    ({"a": None}, {"a": float("nan")}, False),  # NaN is written as null
    ({"a": 2**70}, {"a": 2**70}, False),  # orjson cannot write it: never a parsed value
])
def test_same_json_is_equality_of_the_text_orjson_would_write(a: Any, b: Any,
                                                               same: bool) -> None:
    assert same_json(a, b) is same
    assert same_json(b, a) is same


def test_an_element_is_shared_only_when_it_is_the_same_json() -> None:
    body = sdk_body([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}])
    parsed = parse_growing(body, KEY, None)
    assert parsed.state is not None
    ours = {"role": "assistant", "content": "a"}
    assert not share(parsed, 1, {"content": "a", "role": "assistant"})  # another key order
    assert share(parsed, 1, ours)
    assert parsed.data[KEY][1] is ours and parsed.state.items[1] is ours
    assert parsed.data == orjson.loads(body)
    nxt = parse_growing(sdk_body([{"role": "user", "content": "u"},
                                  {"role": "assistant", "content": "a"},
                                  {"role": "user", "content": "v"}]), KEY, parsed.state)
    assert nxt.extended == 2 and nxt.data[KEY][1] is ours  # the next turn reuses it


# -- the Chat Completions decode over it ---------------------------------------------------
def decode_both(body: bytes, known: list[Any], api_state: ApiState) -> Any:
    """decode_chat with the session's state and with none: the same outcome."""
    from tito.server.openai.decode import decode_chat
    from tito.types.errors import BadRequest

    try:
        fresh = decode_chat(body, known, 64, ApiState(), 1024)
    except BadRequest as exc:
        with pytest.raises(BadRequest) as caught:
            decode_chat(body, known, 64, api_state, 1024)
        assert (caught.value.code, str(caught.value)) == (exc.code, str(exc))
        return None
    got = decode_chat(body, known, 64, api_state, 1024)
    assert got.data == fresh.data and list(got.data) == list(fresh.data)
    # the request's messages are models, or the body's own dicts where they were validated
    # one by one past a known prefix (the turn is built from the data, compared above)
    assert got.request.model_dump(exclude={"messages"}) == \
        fresh.request.model_dump(exclude={"messages"})
    assert got.stored_prefix == fresh.stored_prefix
    assert got.developer == fresh.developer
    assert got.params == fresh.params
    return got.data


def test_a_one_message_chat_body_rewritten_decodes_as_without_the_last_body() -> None:
    """A first body of one (marked) message, sent back rewritten with new ones: matched
    to the array's ``[`` (its other members reused), decoded as whole."""
    api_state = ApiState()
    first = [{"role": "user", "content": [{"type": "text", "text": "u", **MARK}]}]
    known = decode_both(sdk_body(first, model="m", tools=[]), [], api_state)["messages"]
    later = [{"role": "user", "content": [{"type": "text", "text": "u"}]},
             {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}]
    assert parse_growing(sdk_body(later, model="m", tools=[]), KEY,
                         api_state.chat_body.parsed, short=True).same_rest
    decode_both(sdk_body(later, model="m", tools=[]), known, api_state)
    decode_both(sdk_body([], model="m", tools=[]), known, api_state)


def test_chat_bodies_decode_the_same_with_and_without_the_last_body() -> None:
    api_state = ApiState()
    messages: list[Any] = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    known: list[Any] = []
    for turn in range(4):
        body = sdk_body(messages, model="m", max_tokens=8 + (turn == 3), temperature=0.5)
        data = decode_both(body, known, api_state)
        known = data["messages"]
        messages = [*messages, {"role": "assistant", "content": f"a{turn}"},
                    {"role": "tool", "content": "r", "tool_call_id": "c"}]
    assert api_state.chat_body.parsed.head  # the state followed the conversation
    bad = [*messages, {"role": "robot", "content": "x"}]
    decode_both(sdk_body(bad, model="m", max_tokens=9, temperature=0.5), known, api_state)
    decode_both(sdk_body(messages, model="m", max_tokens=0, temperature=0.5), known, api_state)
    decode_both(sdk_body(messages, model="m", max_tokens=9, temperature=0.5)[:-2], known,
                api_state)
    decode_both(sdk_body(messages, model="m", max_tokens=9, temperature=0.5) + b"x", known,
                api_state)
    deep: Any = "x"
    for _ in range(80):
        deep = [deep]
    decode_both(sdk_body([*messages, {"role": "user", "content": "q", "extra": deep}],
                         model="m", max_tokens=9, temperature=0.5), known, api_state)
    decode_both(sdk_body([*messages, {"role": "user", "content": "q"}], model="m",
                         max_tokens=9, temperature=0.5), known, api_state)


def test_a_chat_body_that_rewrites_its_last_message_decodes_past_the_one_before() -> None:
    """A chat client that moves a cache marker to its newest message (as Claude Code does
    on Messages): decoded as without the last body, and parsed past the next-to-last
    message of the last one."""
    api_state = ApiState()
    messages: list[Any] = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    known: list[Any] = []
    extended = []
    for turn in range(5):
        sent = [*messages[:-1], {**messages[-1], "cache_control": {"type": "ephemeral"}}]
        body = orjson.dumps({"model": "m", "messages": sent, "max_tokens": 8})
        previous = api_state.chat_body.parsed if api_state.chat_body else None
        data = decode_both(body, known, api_state)
        extended.append(parse_growing(body, KEY, previous, short=True).extended)
        known = [*data["messages"], {"role": "assistant", "content": f"a{turn}"}]
        messages = [*messages, {"role": "assistant", "content": f"a{turn}"},
                    {"role": "tool", "content": f"r{turn}", "tool_call_id": "c"}]
    assert extended == [0, 1, 3, 5, 7]  # all but the rewritten message, from turn 2 on
    turn_6 = [*messages, {"role": "robot", "content": "x"}]
    decode_both(orjson.dumps({"model": "m", "messages": turn_6, "max_tokens": 8}), known,
                api_state)


def test_developer_roles_and_a_changed_store_decode_as_without_the_last_body() -> None:
    api_state = ApiState()
    messages: list[Any] = [{"role": "user", "content": "u"}]
    known: list[Any] = []
    for turn in range(3):
        data = decode_both(sdk_body(messages, model="m"), known, api_state)
        known = [*data["messages"], {"role": "assistant", "content": f"a{turn}"}]
        messages = [*messages, {"role": "assistant", "content": f"a{turn}"},
                    {"role": "developer" if turn == 1 else "user", "content": "d"}]
    assert api_state.chat_body.developer  # a developer message arrived in a new part
    data = decode_both(sdk_body(messages, model="m"), known, api_state)
    assert api_state.chat_body.developer  # and is remembered for the reused part
    # the store rolled back under the client: a stored message differs now
    rolled = [dict(m) for m in known]
    rolled[1] = {"role": "assistant", "content": "other"}
    decode_both(sdk_body([*messages, {"role": "user"}], model="m"), rolled, api_state)
    # equal values, other objects: still the same answer
    copies = [dict(m) for m in known]
    decode_both(sdk_body([*messages, {"role": "user"}], model="m"), copies, api_state)


def test_the_client_s_copy_of_a_stored_reply_gives_way_to_the_stored_one() -> None:
    """The body state keeps one copy of each message: a reply the client sends back as
    the same JSON is replaced by the session's own object; any other (extra fields, another
    key order) stays the client's. The data is still exactly the body's."""
    from tito.server.openai.decode import decode_chat

    api_state = ApiState()
    user = {"role": "user", "content": "u"}
    data = decode_chat(sdk_body([user], model="m"), [], 64, api_state, 16).data
    stored = [*data["messages"], {"role": "assistant", "content": "a0"}]
    sent = [user, {"role": "assistant", "content": "a0"}, {"role": "user", "content": "v"}]
    body = sdk_body(sent, model="m")
    got = decode_chat(body, stored, 64, api_state, 16)
    assert got.data == orjson.loads(body) and got.data["messages"][1] is stored[1]
    assert api_state.chat_body.parsed.items[1] is stored[1]
    stored = [*got.data["messages"], {"role": "assistant", "content": "a1", "x": 1.0}]
    body = sdk_body([*sent, {"role": "assistant", "content": "a1", "x": 1},
                     {"role": "user", "content": "w"}], model="m")
    got = decode_chat(body, stored, 64, api_state, 16)
    assert got.data["messages"][3] is not stored[3]  # 1 == 1.0, but not the same JSON
    assert type(got.data["messages"][3]["x"]) is int
    assert got.data["messages"][1] is stored[1]


def test_a_client_that_never_extends_its_body_is_decoded_after_the_back_off() -> None:
    """Bodies serialized differently every turn (the state backs off and keeps no
    elements) still decode, their stored replies left as the client's."""
    from tito.server.openai.decode import decode_chat

    api_state = ApiState()
    messages: list[Any] = [{"role": "user", "content": "u"}]
    known: list[Any] = []
    for turn in range(ESTABLISH_MISSES + 4):
        body = json.dumps({"messages": messages, "model": "m"}, indent=turn % 3 or None,
                          separators=None if turn % 2 else (",", ":")).encode()
        got = decode_chat(body, known, 64, api_state, 16)
        assert got.data == orjson.loads(body)
        known = [*got.data["messages"], {"role": "assistant", "content": f"a{turn}"}]
        messages = [*messages, {"role": "assistant", "content": f"a{turn}"},
                    {"role": "user", "content": f"q{turn}"}]
    assert api_state.chat_body.parsed.misses > ESTABLISH_MISSES


def test_without_elements_keeps_placeholders_and_parses_only_the_new_ones() -> None:
    first = orjson.dumps({"messages": [{"role": "user", "content": "a"}], "model": "m"})
    state = without_elements(parse_growing(first, "messages", None).state)
    assert state is not None and state.items == [None]
    second = orjson.dumps({"messages": [{"role": "user", "content": "a"},
                                        {"role": "user", "content": "b"}], "model": "m"})
    parsed = parse_growing(second, "messages", state)
    assert parsed.extended == 1 and parsed.same_rest
    assert parsed.data == {"messages": [None, {"role": "user", "content": "b"}], "model": "m"}
    assert without_elements(None) is None


def test_share_stored_replaces_only_the_same_json_past_start() -> None:
    stored = [{"a": 1}, {"b": 2}, {"c": 3.0}]
    values = [{"a": 1}, {"b": 2}, {"c": 3}]
    share_stored(values, 1, stored)
    assert values[0] is not stored[0]  # before start
    assert values[1] is stored[1]
    assert values[2] is not stored[2]  # 3 and 3.0 are not the same JSON
    shifted = [{"b": 2}]
    share_stored(shifted, 0, stored, shift=1)
    assert shifted[0] is stored[1]


def marked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as Claude Code sends them: a ``cache_control`` marker on the last one
    only (the one it marked the turn before loses it)."""
    out = [dict(m) for m in messages]
    out[-1]["cache_control"] = {"type": "ephemeral"}
    return out


@pytest.mark.parametrize("style", range(4))
@pytest.mark.parametrize("appended", [1, 2, 3])
def test_a_rewritten_last_element_is_parsed_again_alone(style: int, appended: int) -> None:
    """With ``short``, a body whose previous last element was rewritten (Claude Code's
    moving ``cache_control``) is parsed past the element before it; without, whole."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi é \u2028 \"q\""}]
    state = None
    extended = []
    for turn in range(5):
        raw = dumps({"model": "m", "messages": marked(messages), "tools": [{"n": turn > 9}]},
                    style)
        want = orjson.loads(raw)
        got = parse_growing(raw, KEY, state, short=True)
        assert got.data == want and list(got.data) == list(want)
        assert parse_growing(raw, KEY, state).extended == 0  # the plain parse cannot
        state, n = got.state, got.extended
        extended.append(n)
        messages += [{"role": "assistant", "content": f"a{turn}"}] + [
            {"role": "user", "content": "x" * k} for k in range(appended - 1)]
    sizes = [1 + appended * t for t in range(5)]
    assert extended == [0] + [s - 1 for s in sizes[:-1]]


def test_a_short_match_still_extends_an_unchanged_body() -> None:
    """The full head is tried first: an unchanged last element is not parsed again."""
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    first = parse_growing(sdk_body(messages), KEY, None, short=True)
    assert first.state is not None and 0 < first.state.short < first.state.head
    messages.append({"role": "user", "content": "c"})
    assert parse_growing(sdk_body(messages), KEY, first.state, short=True).extended == 2


def test_a_rewrite_before_the_last_element_is_parsed_whole() -> None:
    messages = [{"role": "user", "content": f"m{k}"} for k in range(4)]
    state = parse_growing(sdk_body(messages), KEY, None, short=True).state
    edited = [*messages[:2], {"role": "user", "content": "other"}, messages[3],
              {"role": "user", "content": "new"}]
    got = parse_growing(sdk_body(edited), KEY, state, short=True)
    assert got.extended == 0 and got.data == json.loads(sdk_body(edited))


@settings(max_examples=examples(300), deadline=None)
@given(messages=st.lists(_message, min_size=1, max_size=4),
       rest=st.dictionaries(st.sampled_from(["model", "n", "x", "é"]), _value, max_size=3),
       lead=st.integers(0, 3), style=st.sampled_from([0, 2]))
def test_a_compact_body_s_state_is_the_walked_one(messages: list[Any], rest: dict[str, Any],
                                                   lead: int, style: int) -> None:
    """A body written as ``orjson`` writes it gets its state from the serialization's
    lengths: the very state the walk over the body finds (other bodies: the walk)."""
    items = list(rest.items())
    obj = {**dict(items[:lead]), KEY: messages, **dict(items[lead:])}
    body = dumps(obj, style)
    data = orjson.loads(body)
    compact = _establish_compact(body, KEY, data)
    walked = _establish_walked(body, KEY, data)
    assert walked is not None
    if body != orjson.dumps(data):
        assert compact is None
        return
    assert compact == walked
    assert compact.short > 0  # one element: through the "["
    assert _establish(body, KEY, data) == walked


def test_a_spaced_body_is_walked() -> None:
    body = json.dumps({"model": "m", KEY: [{"role": "user", "content": "a"}] * 2}).encode()
    data = orjson.loads(body)
    assert _establish_compact(body, KEY, data) is None
    assert _establish(body, KEY, data) == _establish_walked(body, KEY, data) is not None
