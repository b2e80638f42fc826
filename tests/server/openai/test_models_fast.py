"""The chat request checks' fast paths against pydantic (tito/server/openai/models.py):
``plain_message_ok`` says yes only to messages ``ChatMessage`` accepts, and
``with_messages`` builds what ``model_copy(update={"messages": ...})`` builds."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.support import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tito.server.openai.models import (
    _MESSAGE,
    ChatCompletionRequest,
    _Envelope,
    plain_message_ok,
    validate_chat,
    with_messages,
)

ROLES = ["system", "developer", "user", "assistant", "tool", "function", "", "User"]
SCALARS = st.one_of(st.none(), st.text(max_size=8), st.integers(), st.booleans(),
                    st.floats(allow_nan=False))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=2),
                   st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "x"]),
                                                   "text": SCALARS}), max_size=2),
                   st.dictionaries(st.text(max_size=4), SCALARS, max_size=2))
FIELDS = ["role", "content", "name", "tool_call_id", "reasoning_content", "tool_calls",
          "extra", "cache_control"]
MESSAGES = st.dictionaries(st.sampled_from(FIELDS),
                           st.one_of(st.sampled_from(ROLES), VALUES), max_size=6)


def pydantic_accepts(message: Any) -> bool:
    try:
        _MESSAGE.validate_python(message)
    except ValidationError:
        return False
    return True


@settings(max_examples=examples(600), deadline=None)
@given(MESSAGES)
def test_plain_message_ok_only_says_yes_to_what_pydantic_accepts(message: dict[str, Any]
                                                                  ) -> None:
    if plain_message_ok(message):
        assert pydantic_accepts(message), message


@pytest.mark.parametrize("message", [
    {"role": "tool", "content": "SAY hi", "tool_call_id": "call_1"},
    {"role": "user", "content": "hello", "cache_control": {"type": "ephemeral"}},
    {"role": "assistant", "content": None, "reasoning_content": "think"},
    {"role": "system", "content": "", "name": "x"},
])
def test_plain_messages_take_the_fast_path(message: dict[str, Any]) -> None:
    assert plain_message_ok(message) and pydantic_accepts(message)


@pytest.mark.parametrize("message", [
    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "robot", "content": "x"},
    {"role": "user", "content": 3},
    {"content": "x"},
    ["role", "user"],
])
def test_other_messages_are_left_to_pydantic(message: Any) -> None:
    assert not plain_message_ok(message)


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "a"}]},
    {"messages": [{"role": "user", "content": "a"}], "model": "m", "max_tokens": 9,
     "temperature": 0.5, "stop": ["x"], "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "a"}], "metadata": {"k": "v"}, "user": "u"},
])
def test_with_messages_is_model_copy(body: dict[str, Any]) -> None:
    request = _Envelope.model_validate(body)
    messages = [*body["messages"], {"role": "assistant", "content": "b"}]
    ours = with_messages(request, messages)
    theirs = request.model_copy(update={"messages": messages})
    assert type(ours) is type(theirs)
    assert ours.__dict__ == theirs.__dict__ and ours.messages is messages
    assert ours.__pydantic_extra__ == theirs.__pydantic_extra__
    assert ours.__pydantic_extra__ is not request.__pydantic_extra__ or \
        request.__pydantic_extra__ is None
    assert ours.__pydantic_fields_set__ == theirs.__pydantic_fields_set__
    assert ours.__pydantic_private__ == theirs.__pydantic_private__
    assert ours == theirs and ours.model_dump() == theirs.model_dump()


def test_a_reused_request_validates_like_a_fresh_one() -> None:
    """A session's third body (same members, more messages) reuses the second's
    validated fields: the same request as a full validation gives."""
    tool = {"role": "tool", "content": "r", "tool_call_id": "c"}
    bodies = [{"messages": [{"role": "user", "content": "a"}], "max_tokens": 5, "x": [1]}]
    for turn in range(2):
        bodies.append({**bodies[0], "messages": [
            *bodies[-1]["messages"], {"role": "assistant", "content": f"b{turn}"}, tool]})
    request, _ = validate_chat(bodies[0])
    for body in bodies[1:]:
        stored = body["messages"][:-1]
        request, verified = validate_chat(body, stored, same_as=request, equal_prefix=0)
        assert verified and isinstance(request, _Envelope)
        assert request.messages == body["messages"]
        full = ChatCompletionRequest.model_validate(body)
        assert {**request.model_dump(), "messages": None} == \
            {**full.model_dump(), "messages": None}
        assert request.__pydantic_fields_set__ == full.__pydantic_fields_set__
