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

The state keeps the chat messages (which the session stores anyway), placeholders for
the parsed items (:func:`~tito.server.growing_body.without_elements`) and the validated
items after the last place where no assistant turn was open; a body that fails to
validate is read again whole, so the error is the one a whole decode gives. The request
comes back without its input (the chat messages are the input; nothing reads it).

New chat messages that are the same JSON as the session's stored message at their place
(the assistant turn the client echoes back) are replaced by the stored object, as the
Messages route does (:mod:`tito.server.anthropic.decode`).

The places of the input's images (each converted to the marker text; the ``--images``
policy is applied by the caller) are listed for every decode: those of the items before
the resumption place are kept in the state with the chat messages.

Pure: no I/O. The state lives in the session's :class:`~tito.server.api_state.ApiState`
(``responses_body``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tito.server.api_state import LastBodies
from tito.server.growing_body import GrowingBody, Parsed, share_stored, without_elements
from tito.server.http import check_depth, decode_growing, decode_json
from tito.server.responses.convert import extend_chat_messages
from tito.server.responses.models import (
    InputItem,
    ResponsesRequest,
    parse_item,
    parse_responses_request,
)
from tito.types.errors import BadRequest
from tito.types.messages import Message


@dataclass(slots=True, frozen=True)
class LastBody:
    """What a decoded Responses body leaves for the session's next one (never changed)."""

    parsed: GrowingBody | None
    """The growing-body state, with placeholders for the items
    (:func:`~tito.server.growing_body.without_elements`)."""
    request: ResponsesRequest
    """The validated request, without its input."""
    chat: list[Message]
    """The chat messages of the body's items (without the ``instructions`` message)."""
    open_from: int
    """The last item index, at or before the body's last item, where no assistant turn
    was open (the conversion of a longer input, or of one that rewrote the last item,
    resumes there) ..."""
    open_chat: int
    """... the length of ``chat`` there ..."""
    open_items: list[InputItem]
    """... and the validated items from there on (the only ones kept)."""
    images: tuple[tuple[int, str], ...] = ()
    """The images of the items before ``open_from`` (item index, place)."""


def decode_responses(body: bytes, max_depth: int, *, state: LastBodies | None = None,
                     stored: list[Message] | None = None, images: list[str] | None = None
                     ) -> tuple[ResponsesRequest, list[Message]]:
    """JSON body -> (its validated request *without its input*, its input as chat
    messages). ``state``: the session's API state, where the last body is kept (None: decode
    whole, keep nothing). ``stored``: the session's stored messages (a copy taken on the
    event loop), for a stateless client whose input is the whole conversation.
    ``images``: gets the places of the input's images (each now the marker text)."""
    last = state.responses_body if state is not None else None
    parsed = decode_growing(body, "input", None if last is None else last.parsed,
                            keep=state is not None, short=True)
    request, items, start, resume = _parse(body, parsed, last, max_depth)
    chat = last.chat[:resume] if last is not None else []  # resume 0: convert all
    found = [i for i in last.images if i[0] < start] if last is not None else []
    request = request.model_copy(update={"input": []}) if request.input else request
    breaks: list[tuple[int, int]] = []
    extend_chat_messages(chat, items, breaks, first=start, images=found)
    # the last break before the last item: a body that rewrites that item (a marker moved
    # on, matched past the item before it) converts again from there
    before_last = [b for b in breaks if b[0] < start + len(items)]
    open_from, open_chat = before_last[-1] if before_last else breaks[-1]
    if stored and request.previous_response_id is None:
        # the turn's messages are `chat` after the instructions' system message, inserted
        # unless `chat` starts with a system message (which it replaces)
        inserted = request.instructions is not None and not (
            chat and chat[0].get("role") == "system")
        share_stored(chat, resume, stored, 1 if inserted else 0)
    if state is not None:
        state.responses_body = LastBody(
            without_elements(parsed.state), request, chat, open_from, open_chat,
            items[open_from - start:], tuple(i for i in found if i[0] < open_from))
    if images is not None:
        images.extend(place for _, place in found)
    return request, list(chat)  # the state's list stays as it is


def _parse(body: bytes, parsed: Parsed, last: LastBody | None, max_depth: int
           ) -> tuple[ResponsesRequest, list[InputItem], int, int]:
    """(the request, the items to convert, the index of the first of them, the length of
    the last body's chat messages the conversion continues; 0, 0: convert all)."""
    # every item of the last body, or all but its last (rewritten: parsed as new)
    reused = parsed.extended if last is not None else 0
    if reused and last is not None and reused >= last.open_from:
        data = parsed.data
        kept = last.open_items[:reused - last.open_from]  # converted again, with the new
        try:
            if parsed.same_rest:  # the other members are last body's: so is their check
                new = data["input"][reused:]
                check_depth({"input": new}, max_depth)
                fresh = [parse_item(item, i) for i, item in enumerate(new, start=reused)]
                return last.request, [*kept, *fresh], last.open_from, last.open_chat
            request, fresh = parse_responses_request(data, max_depth=max_depth, skip=reused)
            return request, [*kept, *fresh], last.open_from, last.open_chat
        except BadRequest:
            pass  # the reused items are placeholders here: word it from the whole body
    request, items = parse_responses_request(
        decode_json(body) if last is not None and parsed.extended else parsed.data,
        max_depth=max_depth)
    return request, items, 0, 0
