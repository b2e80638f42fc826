"""OpenAI Responses serving (design §7.3): the adapter of ``POST /sessions/<id>/v1/responses``
on the shared turn route (:mod:`tito.server.adapter`).

The body is validated (:mod:`tito.server.responses.models`) and decoded past the session's
last one (:mod:`tito.server.responses.decode`); its items become chat messages
(:mod:`tito.server.responses.convert`), after the messages of the response it continues
(:mod:`tito.server.responses.history`); the outcome is sent as a ``response`` or as the
Responses API's stream events (:mod:`tito.server.responses.events`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tito.server.adapter import ApiTurn, EventStream, TurnContext
from tito.server.gateway import TurnOutcome
from tito.server.responses.convert import (
    chat_tools,
    hosted_names,
    namespace_spaces,
    response_body,
    response_head,
    sampling_params,
    template_kwargs,
    with_instructions,
)
from tito.server.responses.decode import decode_responses
from tito.server.responses.events import ResponseEvents, live_events
from tito.server.responses.history import ResponseHistory
from tito.server.responses.models import RESPONSE, ResponseBody, ResponsesRequest
from tito.server.serving import TurnStream
from tito.server.unsupported import (
    NOTE_HOSTED_TOOLS,
    NOTE_IMAGES,
    hosted_tools_refused,
    image_text,
    warn_hosted_once,
)
from tito.types.messages import Message, TurnRequest

Decoded = tuple[ResponsesRequest, list[Message], list[str]]
"""The request (without its input), its input as chat messages, the places of its images."""


class Responses:
    """The Responses turn route's hooks."""

    id_prefix = "resp_"

    def decode(self, ctx: TurnContext, body: bytes) -> Decoded:
        images: list[str] = []
        request, messages = decode_responses(body, ctx.gateway.config.max_json_depth,
                                             state=ctx.bodies, stored=ctx.stored,
                                             images=images)
        return request, messages, images

    def prepare(self, ctx: TurnContext, request: Decoded) -> ApiTurn[Decoded]:
        """The turn: the continued response's messages (if any), then the request's input;
        ``instructions`` as the leading system message."""
        body, new, images = request
        if body.previous_response_id is not None:
            earlier = ResponseHistory.of(ctx.session).messages_of(
                ctx.session, body.previous_response_id)
            messages = [*with_instructions(earlier, body.instructions), *new]
        else:
            messages = with_instructions(new, body.instructions)
        gateway = ctx.gateway
        turn = TurnRequest(messages=messages, tools=chat_tools(body.tools),
                           template_kwargs=template_kwargs(body,
                                                           gateway.renderer.effort_kwargs),
                           notes=turn_notes(ctx, hosted_names(body.tools), images))
        params = sampling_params(body, default_max_tokens=gateway.config.default_max_tokens)
        return ApiTurn(request, turn, params, bool(body.stream), gateway.model_name, body)

    def reply(self, ctx: TurnContext, turn: ApiTurn[Decoded], outcome: TurnOutcome,
              response_id: str) -> ResponseBody:
        """The response; a committed turn (not: the session was deleted meanwhile) is
        remembered for ``previous_response_id``."""
        if outcome.record is not None:
            ResponseHistory.of(ctx.session).remember(
                response_id, [*turn.turn.messages, outcome.parsed.to_message()])
        reasoning = ctx.gateway.renderer.reasoning_tokens(outcome.result.output_ids,
                                                          outcome.parsed)
        return response_body(outcome, turn.request[0], response_id, turn.model, reasoning)

    def dump(self, body: ResponseBody) -> bytes:
        return RESPONSE.dump(body)

    def events(self, ctx: TurnContext, turn: ApiTurn[Decoded], stream: TurnStream,
               response_id: str, reply: Callable[[TurnOutcome], ResponseBody]
               ) -> EventStream:
        head = response_head(turn.request[0], response_id, turn.model)
        events = ResponseEvents(response_id, namespace_spaces(turn.request[0].tools))
        parse = ctx.gateway.renderer.stream_parse(turn.turn.template_kwargs)
        return EventStream(live_events(stream, head, parse, reply, events), events.error)


def turn_notes(ctx: TurnContext, hosted: list[str], images: list[str]
               ) -> dict[str, Any] | None:
    """The turn's notes (None: none): the hosted tools left out of the render (warned once
    per session and tool; 400 under ``--hosted-tools error``) and how many images became
    the marker (400 ``unsupported_content`` under ``--images reject``)."""
    notes: dict[str, Any] = {}
    if images:
        image_text(ctx.gateway.config.images, images[0])
        notes[NOTE_IMAGES] = len(images)
    if hosted:
        hosted_tools_refused(ctx.gateway.config.hosted_tools, hosted, "the request's tools")
        warn_hosted_once(ctx.state.hosted_warned, ctx.session.session_id, hosted)
        notes[NOTE_HOSTED_TOOLS] = hosted
    return notes or None
