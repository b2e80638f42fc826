"""Decode a Responses body in O(new items) when it extends the session's last one.

A client that does not use ``previous_response_id`` resends its whole conversation as
``input`` every turn. Parsed, validated and converted whole, a 200-turn input costs
milliseconds a turn (``benchmarks/chat_decode.py --api responses``).
:func:`decode_responses` gives what ``parse_responses_request`` +
:func:`~tito.server.responses.convert.chat_messages` give, errors included, but when the
body extends the session's last one (:mod:`tito.server.growing_body`: the same bytes up
to the end of its last input item) it parses and validates only the items that follow,
and converts from the last place before them where no assistant turn was open (the
conversion groups a run of reasoning, message and call items into one message, so it
resumes there: :func:`~tito.server.responses.convert.extend_chat_messages`). When the
other members are byte for byte the last body's, the request's fields are reused too.

New chat messages that are the same JSON as the session's stored message at their place
(the assistant turn the client echoes back) are replaced by the stored object, as the
Messages route does (:mod:`tito.server.anthropic.decode`).

Pure: no I/O. The state lives in the session's ``api_state`` (key :data:`STATE`).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from tito.server.growing_body import GrowingBody, share_stored
from tito.server.http import check_depth, decode_growing
from tito.server.responses.convert import extend_chat_messages
from tito.server.responses.models import (
    InputItem,
    ResponsesRequest,
    parse_item,
    parse_responses_request,
)
from tito.types.messages import Message

STATE = "responses_body"
"""The ``api_state`` key of a session's :class:`LastBody`."""


@dataclass(slots=True, frozen=True)
class LastBody:
    """What a decoded Responses body leaves for the session's next one (never changed)."""

    parsed: GrowingBody | None
    request: ResponsesRequest
    items: list[InputItem]
    chat: list[Message]
    """The chat messages of ``items`` (without the ``instructions`` system message)."""
    break_items: list[int]
    """Item indices where no assistant turn is open (ascending), ..."""
    break_chat: list[int]
    """... and the length of ``chat`` there."""


def decode_responses(body: bytes, max_depth: int, *, api_state: dict[str, Any] | None = None,
                     known: list[Message] | None = None
                     ) -> tuple[ResponsesRequest, list[Message]]:
    """JSON body -> (its validated request, its input as chat messages). ``api_state``:
    the session's, where the last body is kept (None: decode whole, keep nothing).
    ``known``: the session's stored messages (a copy taken on the event loop), for a
    stateless client whose input is the whole conversation."""
    last: LastBody | None = api_state.get(STATE) if api_state is not None else None
    parsed = decode_growing(body, "input", None if last is None else last.parsed,
                            keep=api_state is not None)
    data, state, same_rest = parsed.data, parsed.state, parsed.same_rest
    reused = parsed.extended if last is not None else 0
    if reused and last is not None:
        if same_rest:  # the other members are last body's: so is their validation
            new = data["input"][reused:]
            check_depth({"input": new}, max_depth)
            request = last.request.model_copy(update={"input": data["input"]})
            items = last.items[:reused]
            items += [parse_item(item, i) for i, item in enumerate(new, start=reused)]
        else:
            request, items = parse_responses_request(data, max_depth=max_depth,
                                                     known=last.items[:reused])
        # resume the conversion where no assistant turn was open, at or before `reused`
        k = bisect_right(last.break_items, reused) - 1
        start, resume = last.break_items[k], last.break_chat[k]
        chat = last.chat[:resume]
        break_items, break_chat = last.break_items[:k], last.break_chat[:k]
    else:
        request, items = parse_responses_request(data, max_depth=max_depth)
        start, resume, chat, break_items, break_chat = 0, 0, [], [], []
    breaks: list[tuple[int, int]] = []
    extend_chat_messages(chat, items[start:], breaks, first=start)
    break_items += [i for i, _ in breaks]
    break_chat += [n for _, n in breaks]
    if known and request.previous_response_id is None:
        # the turn's messages are `chat` after the instructions' system message, inserted
        # unless `chat` starts with a system message (which it replaces)
        inserted = request.instructions is not None and not (
            chat and chat[0].get("role") == "system")
        share_stored(chat, resume, known, 1 if inserted else 0)
    if api_state is not None:
        api_state[STATE] = LastBody(state, request, items, chat, break_items, break_chat)
    return request, list(chat)  # the state's list stays as it is
