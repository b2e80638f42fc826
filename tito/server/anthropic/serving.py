"""Anthropic Messages serving (design §7.2): the adapter of ``POST /sessions/<id>/v1/messages``
on the shared turn route (:mod:`tito.server.adapter`), and
``POST /sessions/<id>/v1/messages/count_tokens``, on the same session core and records as
the chat route.

The body is decoded past the session's last one (:mod:`tito.server.anthropic.decode`),
converted (:mod:`tito.server.anthropic.convert`), and its outcome sent as a ``message`` or
as the Messages API's stream events (:mod:`tito.server.anthropic.events`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tito.server.adapter import ApiTurn, EventStream, TurnContext
from tito.server.agents import agent_ref
from tito.server.anthropic.convert import (
    message_reply,
    output_schema,
    sampling_params,
    turn_request,
)
from tito.server.anthropic.decode import decode_messages
from tito.server.anthropic.events import error_event, live_events
from tito.server.anthropic.models import (
    MESSAGE,
    TOKEN_COUNT,
    CountTokensRequest,
    MessageReply,
    MessagesRequest,
    parse_request,
)
from tito.server.gateway import Gateway, TurnOutcome
from tito.server.http import read_json
from tito.server.serving import TurnStream
from tito.server.unsupported import NOTE_HOSTED_TOOLS, warn_hosted_once
from tito.types.messages import TurnRequest

JSON = "application/json"
Decoded = tuple[MessagesRequest, TurnRequest]


class Messages:
    """The Messages turn route's hooks."""

    id_prefix = "msg_"

    def decode(self, ctx: TurnContext, body: bytes) -> Decoded:
        config = ctx.gateway.config
        return decode_messages(body, ctx.gateway.renderer, max_depth=config.max_json_depth,
                               state=ctx.bodies, stored=ctx.stored, images=config.images,
                               hosted_tools=config.hosted_tools)

    def prepare(self, ctx: TurnContext, request: Decoded) -> ApiTurn[Decoded]:
        req, turn = request
        hosted = (turn.notes or {}).get(NOTE_HOSTED_TOOLS)
        if hosted:
            warn_hosted_once(ctx.state.hosted_warned, ctx.session.session_id, hosted)
        return ApiTurn(request, turn, sampling_params(req), bool(req.stream),
                       req.model or ctx.gateway.model_name)

    def reply(self, ctx: TurnContext, turn: ApiTurn[Decoded], outcome: TurnOutcome,
              response_id: str) -> MessageReply:
        return message_reply(outcome, turn.model, turn.request[0].stop_sequences)

    def dump(self, body: MessageReply) -> bytes:
        return MESSAGE.dump(body)

    def events(self, ctx: TurnContext, turn: ApiTurn[Decoded], stream: TurnStream,
               response_id: str, reply: Callable[[TurnOutcome], MessageReply]
               ) -> EventStream:
        return EventStream(live_events(stream, ctx.gateway.renderer.parse, response_id,
                                       turn.model, reply), error_event)


async def count_tokens(gateway: Gateway, request: Request) -> Response:
    """The prompt length the same request would have as the session's next turn (planned
    as a turn is, in the agent context its headers name or it would be routed to, then
    released: nothing is stored)."""
    agent = agent_ref(request.scope["headers"])
    session = gateway.session(request.path_params["session_id"])
    data: Any = await read_json(request, gateway.config.max_body_bytes)
    req = parse_request(data, CountTokensRequest, max_depth=gateway.config.max_json_depth)
    config = gateway.config
    turn = turn_request(req, gateway.renderer, images=config.images,
                        hosted_tools=config.hosted_tools)
    turn.agent = agent
    turn.structured = output_schema(req) is not None
    plan = session.plan(turn)
    try:
        count = len(plan.prompt_ids)
    finally:
        session.release(plan)
    return Response(TOKEN_COUNT.dump({"input_tokens": count}), media_type=JSON)
