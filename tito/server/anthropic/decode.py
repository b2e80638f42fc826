"""Decode a Messages body in O(new messages) when it extends the session's last one.

An Anthropic agent resends its whole history every turn, as an OpenAI one does. Parsed,
validated and converted whole, a 200-turn history costs milliseconds a turn
(``benchmarks/chat_decode.py --api anthropic``). :func:`decode_messages` does what
``parse_request`` + :func:`~tito.server.anthropic.convert.turn_request` do, with the same
result and the same errors, but when the body extends the session's last one
(:mod:`tito.server.growing_body`: the same bytes up to the end of its last message) it
parses, validates and converts only the messages that follow:

- the earlier messages are last body's, so they were validated and converted then; their
  chat messages are reused (each message converts on its own:
  :func:`~tito.server.anthropic.convert.chat_messages`), and the state keeps neither
  their parse nor their models (:func:`~tito.server.growing_body.without_elements`): a
  session's state is about its chat messages, which the session stores anyway;
- when the other members are byte for byte last turn's, so is the rest of the request
  (system, tools, thinking); otherwise they are validated and converted again, and a
  body whose declared tools changed is decoded whole (the earlier messages' tool
  references rendered the tools they named);
- any validation failure re-reads the body and validates it whole, so the error is the
  one a whole decode gives;
- Claude Code moves its ``cache_control`` marker to the newest message every turn, so the
  last body's last message comes back rewritten: the body is matched up to the end of
  the last body's next-to-last message too (``short`` in
  :func:`~tito.server.growing_body.parse_growing`), and that message is converted again
  (the state keeps where its chat messages start). A session's first body has one
  message, so its second is matched up to the messages array's ``[``: every message is
  new, but when the members after the array (system prompt, tools) are byte for byte
  the first body's, they are neither parsed nor validated again.

The request comes back without its messages (the turn carries them, converted): nothing
downstream reads them, and the state keeps no copy of them.

The chat messages of the session's stored messages are handed over as the stored objects
when they are the same JSON (:func:`~tito.server.growing_body.same_json`): the assistant
reply the client sends back becomes the gateway's own message, so the session compares
its history with the request by identity, not value by value, and keeps one copy.

Pure: no I/O. The state lives in the session's :class:`~tito.server.api_state.ApiState`
(``messages_body``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError

from tito.render.base import TemplateRenderer
from tito.server.anthropic.convert import (
    Conversion,
    ToolSet,
    chat_messages,
    system_message,
    thinking_kwargs,
    tools_of,
    turn_notes,
)
from tito.server.anthropic.models import InputMessage, MessagesRequest, parse_request
from tito.server.api_state import LastBodies
from tito.server.growing_body import GrowingBody, same_json, share_stored, without_elements
from tito.server.http import check_depth, decode_growing, decode_json
from tito.types.errors import BadRequest
from tito.types.messages import Message, TurnRequest


class _Envelope(MessagesRequest):
    """The request with its messages left unvalidated (they are checked one by one)."""

    messages: list[Any] = Field(min_length=1)


@dataclass(slots=True, frozen=True)
class Rest:
    """What a body's members other than ``messages`` give the turn."""

    system: Message | None
    """The leading system message (of ``request.system``)."""
    tools: ToolSet
    template_kwargs: dict[str, Any] | None


@dataclass(slots=True, frozen=True)
class LastBody:
    """What a decoded Messages body leaves for the session's next one (never changed)."""

    parsed: GrowingBody | None
    """The growing-body state, with placeholders for the messages
    (:func:`~tito.server.growing_body.without_elements`): their chat messages are kept."""
    request: MessagesRequest
    """The validated request, without its messages."""
    rest: Rest
    chat: list[Message]
    """The chat messages of the body's messages, in order (the system one not included)."""
    images: int
    """How many images of those messages became the marker (``--images placeholder``)."""
    last_chat: int = 0
    """The length of ``chat`` before the last message's chat messages ..."""
    last_images: int = 0
    """... and ``images`` before them: what a body that rewrites the last message reuses."""


def decode_messages(body: bytes, renderer: TemplateRenderer, *, max_depth: int,
                    state: LastBodies | None = None, stored: list[Message] | None = None,
                    images: str = "reject", hosted_tools: str = "drop"
                    ) -> tuple[MessagesRequest, TurnRequest]:
    """(the validated request *without its messages*, the turn: its chat messages).
    ``state``: the session's API state, where the last body is kept (None: decode whole, keep
    nothing). ``stored``: the session's stored messages (a copy taken on the event loop).
    ``images``, ``hosted_tools``: the server's ``--images`` and ``--hosted-tools``."""
    last = state.messages_body if state is not None else None
    parsed = decode_growing(body, "messages", None if last is None else last.parsed,
                            keep=state is not None, short=True)
    reused = parsed.extended if last is not None else 0  # every message of the last body
    # (or all but its last; none when it had one, matched to the "[" with the same rest)
    extended = _extended(parsed.data, last, reused, parsed.same_rest, max_depth, renderer,
                         hosted_tools) if (reused or parsed.same_rest) and last is not None \
        else None
    if extended is None:
        # the reused messages are placeholders in an extended parse: read the body whole
        data = decode_json(body) if reused else parsed.data
        req = parse_request(data, MessagesRequest, max_depth=max_depth)
        reused, new = 0, req.messages
        req = req.model_copy(update={"messages": []})
        rest = _rest(req, renderer, hosted_tools, last)
    else:
        req, new, rest = extended
    chat, before = _reused_chat(last, reused)
    start = len(chat)
    conversion = Conversion(images, rest.tools.declared)
    last_chat, last_images = start, 0
    for i, message in enumerate(new, start=reused):
        last_chat, last_images = len(chat), conversion.replaced
        chat.extend(chat_messages(message, i, conversion))
    replaced = conversion.replaced + before
    last_images += before
    system = rest.system
    if stored:
        if system is not None and system is not stored[0] and same_json(system, stored[0]):
            system = stored[0]  # e.g. after a restart: the replayed session's own object
            rest = Rest(system, rest.tools, rest.template_kwargs)
        share_stored(chat, start, stored, 0 if system is None else 1)
    if state is not None:
        if not new and last is not None:  # the same messages: the same last one
            last_chat, last_images = last.last_chat, last.last_images
        state.messages_body = LastBody(without_elements(parsed.state), req, rest, chat,
                                       replaced, last_chat, last_images)
    messages = list(chat) if system is None else [system, *chat]  # the state's stays as is
    return req, TurnRequest(messages=messages, tools=rest.tools.rendered,
                            template_kwargs=rest.template_kwargs,
                            notes=turn_notes(rest.tools, replaced))


def _reused_chat(last: LastBody | None, reused: int) -> tuple[list[Message], int]:
    """(the chat messages of the last body's first ``reused`` messages, how many images
    they replaced): all of its messages, or all but its last (rewritten) one."""
    if not reused or last is None:
        return [], 0
    if last.parsed is not None and reused < len(last.parsed.items):
        return last.chat[:last.last_chat], last.last_images
    return list(last.chat), last.images


def _rest(req: MessagesRequest, renderer: TemplateRenderer, hosted_tools: str,
          last: LastBody | None) -> Rest:
    """The turn's system message, tools and template settings of ``req``."""
    system = system_message(req)
    if last is not None and system is not None and system == last.rest.system:
        system = last.rest.system  # the same object as stored
    return Rest(system, tools_of(req, hosted_tools), thinking_kwargs(req, renderer))


def _extended(data: Any, last: LastBody, reused: int, same_rest: bool, max_depth: int,
              renderer: TemplateRenderer, hosted_tools: str
              ) -> tuple[MessagesRequest, list[InputMessage], Rest] | None:
    """A body that extends ``last``: (its request without messages, the models of the
    messages past the first ``reused``, its :class:`Rest`); None: decode it whole (it is
    invalid, and the whole decode words the error; or its tools changed, which the
    reused messages' tool references were converted with)."""
    validated = _validated(data, last, reused, same_rest, max_depth)
    if validated is None:
        return None
    req, new = validated
    if same_rest:
        return req, new, last.rest
    try:
        rest = _rest(req, renderer, hosted_tools, last)
    except BadRequest:
        return None
    if rest.tools.declared != last.rest.tools.declared:
        return None
    return req, new, rest


def _validated(data: Any, last: LastBody, reused: int, same_rest: bool, max_depth: int
               ) -> tuple[MessagesRequest, list[InputMessage]] | None:
    """(the request without messages, the models of the messages past the first
    ``reused``, which last body's were); None: validate it whole (which words the error,
    if any)."""
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list) \
            or not data["messages"]:  # none: the whole validation words the error
        return None
    new = data["messages"][reused:]
    try:
        check_depth({"messages": new} if same_rest else {**data, "messages": new}, max_depth)
        models = [InputMessage.model_validate(m) for m in new]
        if same_rest:
            return last.request, models
        request = _Envelope.model_validate(data).model_copy(update={"messages": []})
        return request, models
    except (ValidationError, BadRequest):
        return None
