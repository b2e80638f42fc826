"""Decode a Messages body in O(new messages) when it extends the session's last one.

An Anthropic agent resends its whole history every turn, as an OpenAI one does. Parsed,
validated and converted whole, a 200-turn history costs milliseconds a turn
(``benchmarks/chat_decode.py --api anthropic``). :func:`decode_messages` does what
``parse_request`` + :func:`~tito.server.anthropic.convert.turn_request` do, with the same
result and the same errors, but when the body extends the session's last one
(:mod:`tito.server.growing_body`: the same bytes up to the end of its last message) it
parses, validates and converts only the messages that follow:

- the earlier messages are last turn's parsed objects, so they were validated and
  converted then; their validated models and chat messages are reused (each message
  converts on its own: :func:`~tito.server.anthropic.convert.chat_messages`);
- when the other members are byte for byte last turn's, so is the rest of the request
  (system, tools, thinking); otherwise they are validated and converted again;
- any validation failure re-runs the full validation, whose error is the one returned.

The chat messages of the session's stored messages are handed over as the stored objects
when they are the same JSON (:func:`~tito.server.growing_body.same_json`): the assistant
reply the client sends back becomes the gateway's own message, so the session compares
its history with the request by identity, not value by value, and keeps one copy.

Pure: no I/O. The state lives in the session's ``api_state`` (key :data:`STATE`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError

from tito.render.base import TemplateRenderer
from tito.server.anthropic.convert import (
    chat_messages,
    system_message,
    thinking_kwargs,
    tools_of,
)
from tito.server.anthropic.models import InputMessage, MessagesRequest, parse_request
from tito.server.growing_body import GrowingBody, same_json, share_stored
from tito.server.http import check_depth, decode_growing
from tito.types.errors import BadRequest
from tito.types.messages import Message, TurnRequest

STATE = "messages_body"
"""The ``api_state`` key of a session's :class:`LastBody`."""


class _Envelope(MessagesRequest):
    """The request with its messages left unvalidated (they are checked one by one)."""

    messages: list[Any] = Field(min_length=1)


@dataclass(slots=True, frozen=True)
class LastBody:
    """What a decoded Messages body leaves for the session's next one (never changed)."""

    parsed: GrowingBody | None
    request: MessagesRequest
    system: Message | None
    """The leading system message (of ``request.system``)."""
    chat: list[Message]
    """The chat messages of ``request.messages``, in order (the system one not included)."""
    ends: list[int]
    """``ends[i]``: where the chat messages of ``request.messages[i]`` end in ``chat``."""
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any] | None


def decode_messages(body: bytes, renderer: TemplateRenderer, *, max_depth: int,
                    api_state: dict[str, Any] | None = None,
                    known: list[Message] | None = None) -> tuple[MessagesRequest, TurnRequest]:
    """The validated request and its turn. ``api_state``: the session's, where the last
    body is kept (None: decode whole, keep nothing). ``known``: the session's stored
    messages (a copy taken on the event loop)."""
    last: LastBody | None = api_state.get(STATE) if api_state is not None else None
    parsed = decode_growing(body, "messages", None if last is None else last.parsed,
                            keep=api_state is not None)
    parsed_data, state, same_rest = parsed.data, parsed.state, parsed.same_rest
    reused = parsed.extended if last is not None else 0
    req = _validated(parsed_data, last, reused, same_rest, max_depth) \
        if reused and last is not None else None
    if req is None:
        req = parse_request(parsed_data, MessagesRequest, max_depth=max_depth)
        reused = 0
    if reused and last is not None:
        chat = last.chat[:last.ends[reused - 1]]
        ends = last.ends[:reused]
    else:
        chat, ends = [], []
    for i in range(reused, len(req.messages)):
        chat.extend(chat_messages(req.messages[i], i))
        ends.append(len(chat))
    if same_rest and last is not None:
        system, tools, kwargs = last.system, last.tools, last.template_kwargs
    else:
        system, tools = system_message(req), tools_of(req)
        kwargs = thinking_kwargs(req, renderer)
        if last is not None and system is not None and system == last.system:
            system = last.system  # the same object as stored
    head = 0 if system is None else 1
    if known:
        if system is not None and system is not known[0] and same_json(system, known[0]):
            system = known[0]  # e.g. after a restart: the replayed session's own object
        share_stored(chat, ends[reused - 1] if reused else 0, known, head)
    if api_state is not None:
        api_state[STATE] = LastBody(state, req, system, chat, ends, tools, kwargs)
    messages = list(chat) if system is None else [system, *chat]  # the state's stays as is
    return req, TurnRequest(messages=messages, tools=tools, template_kwargs=kwargs)


def _validated(data: Any, last: LastBody, reused: int, same_rest: bool, max_depth: int
               ) -> MessagesRequest | None:
    """``data`` validated past its first ``reused`` messages (last body's, already
    validated); None: validate it whole (which words the error, if any)."""
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        return None
    new = data["messages"][reused:]
    try:
        check_depth({"messages": new} if same_rest else {**data, "messages": new}, max_depth)
        models = [*last.request.messages[:reused],
                  *(InputMessage.model_validate(m) for m in new)]
        if same_rest:
            return last.request.model_copy(update={"messages": models})
        return _Envelope.model_validate(data).model_copy(update={"messages": models})
    except (ValidationError, BadRequest):
        return None
