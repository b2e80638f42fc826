"""Anthropic Messages serving: ``POST /sessions/<id>/v1/messages`` (and
``/v1/messages/count_tokens``) on the same session core and records as the chat route."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tito.server.anthropic.convert import message_reply, sampling_params, turn_request
from tito.server.anthropic.models import (
    MESSAGE,
    TOKEN_COUNT,
    CountTokensRequest,
    MessagesRequest,
    parse_request,
)
from tito.server.gateway import Gateway
from tito.server.http import decode_json, read_json
from tito.server.serving import read_turn_body, run_api_turn
from tito.types.errors import BadRequest
from tito.types.messages import TurnRequest

JSON = "application/json"


def decode_messages(body: bytes, gateway: Gateway) -> tuple[MessagesRequest, TurnRequest]:
    req: MessagesRequest = parse_request(decode_json(body), MessagesRequest,
                                         max_depth=gateway.config.max_json_depth)
    return req, turn_request(req, gateway.renderer)


async def messages(gateway: Gateway, request: Request) -> Response:
    session = gateway.session(request.path_params["session_id"])
    raw, heavy, (req, turn) = await read_turn_body(
        gateway, request, lambda body: decode_messages(body, gateway))
    if req.stream:
        raise BadRequest("stream: true is not supported on /v1/messages yet; send the "
                         "request without streaming")
    body = await run_api_turn(
        gateway, request, session, raw, turn, sampling_params(req), heavy=heavy,
        response_id=f"msg_{uuid.uuid4().hex}",
        build=lambda outcome: message_reply(outcome, req.model or gateway.model_name,
                                            req.stop_sequences))
    return Response(MESSAGE.dump(body), media_type=JSON)


async def count_tokens(gateway: Gateway, request: Request) -> Response:
    """The prompt length the same request would have as the session's next turn (planned
    as a turn is, then released: nothing is stored)."""
    session = gateway.session(request.path_params["session_id"])
    data: Any = await read_json(request, gateway.config.max_body_bytes)
    req = parse_request(data, CountTokensRequest, max_depth=gateway.config.max_json_depth)
    plan = session.plan(turn_request(req, gateway.renderer))
    try:
        count = len(plan.prompt_ids)
    finally:
        session.release(plan)
    return Response(TOKEN_COUNT.dump({"input_tokens": count}), media_type=JSON)
