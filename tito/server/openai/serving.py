"""OpenAI Chat Completions serving (design §7.1): the adapter of
``POST /sessions/<id>/v1/chat/completions`` on the shared turn route
(:mod:`tito.server.adapter`), and ``GET /sessions/<id>/v1/models``.

The body is validated (:mod:`tito.server.openai.models`) and decoded past the session's
last one (:mod:`tito.server.openai.decode`), converted into the core turn
(:mod:`tito.server.openai.convert`), and its outcome sent as a ``chat.completion`` or, with
``stream: true``, as SSE chunks (:mod:`tito.server.openai.events`).
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from tito.server.adapter import ApiTurn, EventStream, TurnContext
from tito.server.errors import error_body
from tito.server.gateway import Gateway, TurnOutcome
from tito.server.openai.compat import one_chunk, request_settings, with_meta_info
from tito.server.openai.convert import completion, hosted_names, turn_request, with_effort
from tito.server.openai.decode import DecodedChat, decode_chat
from tito.server.openai.events import DONE, live_events
from tito.server.openai.models import (
    CHAT_COMPLETION,
    MODEL_LIST,
    ChatCompletion,
    ChatCompletionRequest,
    ModelList,
)
from tito.server.serving import TurnStream
from tito.server.unsupported import NOTE_HOSTED_TOOLS, hosted_tools_refused, warn_hosted_once
from tito.types.errors import TitoError
from tito.types.messages import TurnRequest

JSON = "application/json"


class ChatCompletions:
    """The Chat Completions turn route's hooks."""

    id_prefix = "chatcmpl-"

    def decode(self, ctx: TurnContext, body: bytes) -> DecodedChat:
        config = ctx.gateway.config
        return decode_chat(body, ctx.stored, config.max_json_depth, ctx.bodies,
                           config.default_max_tokens)

    def prepare(self, ctx: TurnContext, request: DecodedChat) -> ApiTurn[DecodedChat]:
        turn = turn_request(request.data, request.request, request.stored_prefix,
                            request.developer, images=ctx.gateway.config.images)
        harness_settings(ctx, request.request, turn)
        turn.settings = request_settings(request.data)
        return ApiTurn(request, turn, request.params, bool(request.request.stream),
                       ctx.gateway.model_name, request.request)

    def reply(self, ctx: TurnContext, turn: ApiTurn[DecodedChat], outcome: TurnOutcome,
              response_id: str) -> ChatCompletion:
        reasoning = ctx.gateway.renderer.reasoning_tokens(outcome.result.output_ids,
                                                          outcome.parsed)
        body = completion(outcome, turn.model, reasoning)
        if turn.request.request.return_meta_info or ctx.gateway.config.compat == "miles":
            return with_meta_info(body, outcome)
        return body

    def one_chunk(self, body: ChatCompletion) -> bytes:
        """``--compat miles``: the reply as one stream event (the reference's stream)."""
        return one_chunk(body)

    def dump(self, body: ChatCompletion) -> bytes:
        return CHAT_COMPLETION.dump(body)

    def events(self, ctx: TurnContext, turn: ApiTurn[DecodedChat], stream: TurnStream,
               response_id: str, reply: Callable[[TurnOutcome], ChatCompletion]
               ) -> EventStream:
        options = turn.request.request.stream_options
        parse = ctx.gateway.renderer.stream_parse(turn.turn.template_kwargs)
        return EventStream(live_events(stream, parse, turn.model,
                                       response_id, bool(options and options.include_usage),
                                       reply), error_event, DONE)


def harness_settings(ctx: TurnContext, chat: ChatCompletionRequest, turn: TurnRequest
                     ) -> None:
    """``turn`` with the template kwargs of ``reasoning_effort`` and the note of the hosted
    tools left out of the render (warned once per session and tool; 400 under
    ``--hosted-tools error``)."""
    with_effort(turn, chat, ctx.gateway.renderer.effort_kwargs)
    hosted = hosted_names(chat)
    if hosted:
        hosted_tools_refused(ctx.gateway.config.hosted_tools, hosted, "the request")
        warn_hosted_once(ctx.state.hosted_warned, ctx.session.session_id, hosted)
        turn.notes = {**(turn.notes or {}), NOTE_HOSTED_TOOLS: hosted}


def error_event(error: TitoError) -> bytes:
    return b"data: " + error_body(error) + b"\n\n"


async def list_models(gateway: Gateway, request: Request) -> Response:
    gateway.session(request.path_params["session_id"])
    body: ModelList = {"object": "list", "data": [{
        "id": gateway.model_name, "object": "model", "created": int(gateway.started_at),
        "owned_by": "tito", "max_model_len": gateway.config.max_seq_len}]}
    return Response(MODEL_LIST.dump(body), media_type=JSON)
