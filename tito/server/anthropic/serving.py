"""Anthropic Messages serving (design §7.2): the adapter of ``POST /sessions/<id>/v1/messages``
on the shared turn route (:mod:`tito.server.adapter`), and
``POST /sessions/<id>/v1/messages/count_tokens``, on the same session core and records as
the chat route.

The body is decoded past the session's last one (:mod:`tito.server.anthropic.decode`),
converted (:mod:`tito.server.anthropic.convert`), and its outcome sent as a ``message`` or
as the Messages API's stream events (:mod:`tito.server.anthropic.events`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

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
from tito.server.http import decode_json
from tito.server.serving import TurnStream, read_turn_body
from tito.server.unsupported import NOTE_HOSTED_TOOLS, warn_hosted_once
from tito.session import Session
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
                       req.model or ctx.gateway.model_name, req)

    def reply(self, ctx: TurnContext, turn: ApiTurn[Decoded], outcome: TurnOutcome,
              response_id: str) -> MessageReply:
        return message_reply(outcome, turn.model, turn.request[0].stop_sequences)

    def dump(self, body: MessageReply) -> bytes:
        return MESSAGE.dump(body)

    def events(self, ctx: TurnContext, turn: ApiTurn[Decoded], stream: TurnStream,
               response_id: str, reply: Callable[[TurnOutcome], MessageReply]
               ) -> EventStream:
        parse = ctx.gateway.renderer.stream_parse(turn.turn.template_kwargs)
        return EventStream(live_events(stream, parse, response_id, turn.model, reply),
                           error_event)


async def count_tokens(gateway: Gateway, request: Request) -> Response:
    """The prompt length the same request would have as the session's next turn (planned
    as a turn is, in the agent context its headers name or it would be routed to, then
    released: nothing is stored). A body over ``OFFLOAD_BYTES`` is decoded and rendered in
    the worker pool, as a turn's is: the context is claimed on the loop meanwhile."""
    agent = agent_ref(request.scope["headers"])
    session = gateway.session(request.path_params["session_id"])
    _, offload, turn = await read_turn_body(
        gateway, request, lambda raw: _count_request(gateway, raw))
    turn.agent = agent
    count = await _planned_length(gateway, session, turn, offload)
    return Response(TOKEN_COUNT.dump({"input_tokens": count}), media_type=JSON)


def _count_request(gateway: Gateway, raw: bytes) -> TurnRequest:
    """A count_tokens body as the turn it would be (pure: runs in the worker pool)."""
    config = gateway.config
    req = parse_request(decode_json(raw), CountTokensRequest, max_depth=config.max_json_depth)
    turn = turn_request(req, gateway.renderer, images=config.images,
                        hosted_tools=config.hosted_tools)
    turn.structured = output_schema(req) is not None
    return turn


async def _planned_length(gateway: Gateway, session: Session, turn: TurnRequest,
                          offload: bool) -> int:
    """The prompt length of ``turn`` planned in ``session`` (claimed and released on the
    loop; ``offload``: planned in the worker pool, the claim held until the worker is done
    even when the request is cancelled, so no turn changes the session it reads)."""
    session.begin(turn)
    try:
        if not offload:
            return len(session.prepare(turn).prompt_ids)
        planning = asyncio.ensure_future(gateway.offload(session.prepare, turn))
        try:
            plan = await asyncio.shield(planning)
        except asyncio.CancelledError:
            await asyncio.wait([planning])
            raise
        return len(plan.prompt_ids)
    finally:
        session.release(request=turn)
