"""OpenAI Responses serving: request -> core turn, turn outcome -> ``response``.

``POST /sessions/<id>/v1/responses`` (non-streaming) validates the body
(:mod:`tito.server.responses.models`), converts its items into chat messages
(:mod:`tito.server.responses.convert`), and runs the turn on the same session core and
records as Chat Completions (:func:`tito.server.serving.run_api_turn`).

``previous_response_id`` continues an earlier response *of the same session*: each session
remembers, for its latest :data:`MAX_REMEMBERED` responses, the whole chat message list of
that turn (the request's messages and the assistant message produced), and the new
request's messages are that list followed by its own input.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response

from tito.server.api import route_of
from tito.server.gateway import Gateway, TurnOutcome
from tito.server.http import cancel_on_disconnect
from tito.server.openai.serving import STREAM_PARSE_EVERY
from tito.server.responses.convert import (
    chat_tools,
    response_body,
    response_head,
    sampling_params,
    template_kwargs,
    with_instructions,
)
from tito.server.responses.decode import decode_responses
from tito.server.responses.models import (
    RESPONSE,
    ResponseBody,
    ResponsesRequest,
)
from tito.server.responses.streaming import live_events
from tito.server.serving import open_turn_stream, read_turn_body, run_api_turn, sse_response
from tito.session import Session, TreeSession
from tito.session.tree import path_messages, path_of
from tito.types.errors import BadRequest
from tito.types.messages import Message, TurnRequest

JSON = "application/json"
MAX_REMEMBERED = 256
"""Responses per session that ``previous_response_id`` can continue."""


@dataclass
class ResponseHistory:
    """Per session: response id -> the chat messages of that turn, its reply included."""

    turns: OrderedDict[str, list[Message]] = field(default_factory=OrderedDict)

    @classmethod
    def of(cls, session: Session) -> ResponseHistory:
        history = session.api_state.get("responses")
        if history is None:
            history = session.api_state["responses"] = cls()
        return history

    def remember(self, response_id: str, messages: list[Message]) -> None:
        self.turns[response_id] = messages
        while len(self.turns) > MAX_REMEMBERED:
            self.turns.popitem(last=False)

    def messages_of(self, session: Session, response_id: str) -> list[Message]:
        """The messages ``response_id`` ended with (BadRequest when this session has no
        such response). A v2 tree keeps every node's response id, so there a response
        the map forgot (or one from before a journal replay) is found on its node."""
        messages = self.turns.get(response_id)
        if messages is not None:
            return messages
        if isinstance(session, TreeSession):
            nodes = session.nodes
            for node in reversed(nodes):
                if node.response_id == response_id:
                    return path_messages(path_of(nodes, node.id))
        raise BadRequest(f"previous response {response_id!r} is not known in session "
                         f"{session.session_id} (a response can only be continued in the "
                         f"session that produced it, and only its latest {MAX_REMEMBERED} "
                         "responses are kept)", code="previous_response_not_found")


def turn_request(gateway: Gateway, session: Session, request: ResponsesRequest,
                 new: list[Message]) -> TurnRequest:
    """The turn: the continued response's messages (if any), then the request's input;
    ``instructions`` as the leading system message."""
    if request.previous_response_id is not None:
        earlier = ResponseHistory.of(session).messages_of(session,
                                                          request.previous_response_id)
        messages = [*with_instructions(earlier, request.instructions), *new]
    else:
        messages = with_instructions(new, request.instructions)
    return TurnRequest(messages=messages, tools=chat_tools(request.tools),
                       template_kwargs=template_kwargs(
                           request, gateway.renderer.spec.thinking_kwarg))


async def responses(gateway: Gateway, request: Request) -> Response:
    session = gateway.session(request.path_params["session_id"])
    known, depth = list(session.messages), gateway.config.max_json_depth
    raw, heavy, (body, new) = await read_turn_body(
        gateway, request, lambda data: decode_responses(
            data, depth, api_state=session.api_state, known=known))
    turn = turn_request(gateway, session, body, new)
    params = sampling_params(body, default_max_tokens=gateway.config.default_max_tokens)
    response_id = f"resp_{os.urandom(16).hex()}"

    def build(outcome: TurnOutcome) -> ResponseBody:
        if outcome.record is not None:  # committed (not: the session was deleted meanwhile)
            ResponseHistory.of(session).remember(
                response_id, [*turn.messages, outcome.parsed.to_message()])
        return response_body(outcome, body, response_id, gateway.model_name)

    if body.stream:
        stream = await cancel_on_disconnect(request, open_turn_stream(
            gateway, session, turn, params, heavy=heavy, response_id=response_id,
            route=route_of(request)))
        head = response_head(body, response_id, gateway.model_name)
        return sse_response(live_events(stream, head, gateway.renderer.parse,
                                        STREAM_PARSE_EVERY, build))
    reply = await run_api_turn(gateway, request, session, raw, turn, params, heavy=heavy,
                               response_id=response_id, build=build)
    return Response(RESPONSE.dump(reply), media_type=JSON)
