"""OpenAI Chat Completions serving: request -> core turn, turn outcome -> response.

``POST /sessions/<id>/v1/chat/completions`` validates the body
(:mod:`tito.server.openai.models`), converts it into a :class:`TurnRequest` and
:class:`SamplingParams`, runs the turn on the :class:`Gateway`, and renders the
:class:`TurnOutcome` as a ``chat.completion`` or, with ``stream: true``, as SSE chunks.
``GET /sessions/<id>/v1/models`` lists the served model.
"""

from __future__ import annotations

import operator
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import Response

from tito.parse.stream import Delta
from tito.server.api import route_of
from tito.server.gateway import Gateway, TurnOutcome
from tito.server.growing_body import GrowingBody, share
from tito.server.http import cancel_on_disconnect, decode_growing
from tito.server.openai.errors import error_body, status_of
from tito.server.openai.models import (
    CHAT_COMPLETION,
    CHAT_COMPLETION_CHUNK,
    MODEL_LIST,
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceDelta,
    ChunkChoice,
    ModelList,
    ToolCallOut,
    validate_chat,
)
from tito.server.serving import (
    TurnStream,
    open_turn_stream,
    read_turn_body,
    run_api_turn,
    sse_response,
)
from tito.types.engine import SamplingParams
from tito.types.messages import Message, TurnRequest

JSON = "application/json"
STREAM_PARSE_EVERY = 4
"""A streamed turn's text is parsed again after this many new ids (or a 16th of the ids
so far, whichever is more)."""


# -- request -> core ---------------------------------------------------------------------
_ROLE = operator.methodcaller("get", "role")


def has_developer(messages: list[Message]) -> bool:
    return "developer" in map(_ROLE, messages)  # C-level: no Python call per message


def session_messages(data: dict[str, Any], developer: bool | None = None) -> list[Message]:
    """The client's messages as sent, with ``developer`` read as ``system``;
    ``developer``: whether any message has that role, when known (else they are scanned)."""
    messages: list[Message] = data["messages"]
    if not (has_developer(messages) if developer is None else developer):
        return messages
    return [{**m, "role": "system"} if m.get("role") == "developer" else m
            for m in messages]


def turn_request(data: dict[str, Any], chat: ChatCompletionRequest,
                 stored_prefix: list[Message] | None = None,
                 developer: bool | None = None) -> TurnRequest:
    return TurnRequest(messages=session_messages(data, developer),
                       tools=data.get("tools") or None,
                       template_kwargs=chat.chat_template_kwargs,
                       stored_prefix=stored_prefix)


def sampling_params(chat: ChatCompletionRequest, *, default_max_tokens: int) -> SamplingParams:
    """OpenAI sampling fields -> explicit engine settings (OpenAI's defaults filled in)."""
    max_tokens = chat.max_completion_tokens or chat.max_tokens or chat.max_new_tokens
    stop = (chat.stop,) if isinstance(chat.stop, str) else tuple(chat.stop or ())
    return SamplingParams(
        max_new_tokens=max_tokens or default_max_tokens,
        temperature=1.0 if chat.temperature is None else chat.temperature,
        top_p=1.0 if chat.top_p is None else chat.top_p,
        top_k=-1 if chat.top_k is None else chat.top_k,
        min_p=chat.min_p or 0.0,
        frequency_penalty=chat.frequency_penalty or 0.0,
        presence_penalty=chat.presence_penalty or 0.0,
        repetition_penalty=1.0 if chat.repetition_penalty is None else chat.repetition_penalty,
        stop=stop,
        stop_token_ids=tuple(chat.stop_token_ids or ()),
        seed=chat.seed,
    )


# -- outcome -> response -----------------------------------------------------------------
def completion(outcome: TurnOutcome, model: str) -> ChatCompletion:
    """The ``chat.completion`` of a turn."""
    parsed = outcome.parsed
    message: AssistantMessage = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning_content is not None:
        message["reasoning_content"] = parsed.reasoning_content
    if parsed.tool_calls:
        message["tool_calls"] = cast("list[ToolCallOut]", parsed.tool_calls)
    generated = len(outcome.result.output_ids)
    return {
        "id": outcome.response_id or f"chatcmpl-{os.urandom(16).hex()}",
        "object": "chat.completion",
        "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": parsed.finish_reason}],
        "usage": {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": generated,
                  "total_tokens": outcome.prompt_tokens + generated,
                  "prompt_tokens_details": {"cached_tokens": outcome.result.cached_tokens}},
    }


def _sse(chunk: ChatCompletionChunk) -> bytes:
    return b"data: " + CHAT_COMPLETION_CHUNK.dump(chunk) + b"\n\n"


def _chunk(response_id: str, created: int, model: str, delta: ChoiceDelta | None,
           finish_reason: str | None = None) -> ChatCompletionChunk:
    choices: list[ChunkChoice] = [] if delta is None else [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    return {"id": response_id, "object": "chat.completion.chunk", "created": created,
            "model": model, "choices": choices}


def _call_deltas(calls: list[ToolCallOut] | list[dict[str, Any]], first: int = 0
                 ) -> list[ChoiceDelta]:
    """Each tool call as Chat streams it: id and name, then its arguments."""
    out: list[ChoiceDelta] = []
    for i, call in enumerate(calls, start=first):
        function = call["function"]
        out.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                    "function": {"name": function["name"],
                                                 "arguments": ""}}]})
        out.append({"tool_calls": [{"index": i,
                                    "function": {"arguments": function["arguments"]}}]})
    return out


async def stream_events(body: ChatCompletion, include_usage: bool) -> AsyncIterator[bytes]:
    """An answered turn again (a retry of it) as ``chat.completion.chunk`` s: the whole
    message, the finish reason (+ usage chunk) and ``[DONE]``."""
    choice = body["choices"][0]
    message = choice["message"]
    delta: ChoiceDelta = {"role": "assistant", "content": message["content"]}
    if "reasoning_content" in message:
        delta["reasoning_content"] = message["reasoning_content"]
    rid, created, model = body["id"], body["created"], body["model"]
    yield _sse(_chunk(rid, created, model, delta))
    for call_delta in _call_deltas(message.get("tool_calls", [])):
        yield _sse(_chunk(rid, created, model, call_delta))
    yield _sse(_chunk(rid, created, model, {}, choice["finish_reason"]))
    if include_usage:
        last = _chunk(rid, created, model, None)
        last["usage"] = body["usage"]
        yield _sse(last)
    yield b"data: [DONE]\n\n"


async def live_events(stream: TurnStream, gateway: Gateway, response_id: str,
                      include_usage: bool) -> AsyncIterator[bytes]:
    """A turn as the engine generates it: content and reasoning deltas, each tool call once
    it is complete, then (the turn committed) the rest, the finish reason, usage and
    ``[DONE]``. An error after the first byte is one ``data: {"error": ...}`` event."""
    created, model = int(time.time()), gateway.model_name
    try:
        yield _sse(_chunk(response_id, created, model, {"role": "assistant", "content": ""}))
        async for event in stream.deltas(gateway.renderer.parse, STREAM_PARSE_EVERY):
            if isinstance(event, Delta):
                for delta in _text_and_calls(event):
                    yield _sse(_chunk(response_id, created, model, delta))
                continue
            body = completion(event, model)
            yield _sse(_chunk(response_id, created, model, {},
                              body["choices"][0]["finish_reason"]))
            if include_usage:
                last = _chunk(response_id, created, model, None)
                last["usage"] = body["usage"]
                yield _sse(last)
    except Exception as exc:
        yield b"data: " + error_body(stream.failed(exc, status_of)) + b"\n\n"
    finally:
        await stream.aclose()
    yield b"data: [DONE]\n\n"


def _text_and_calls(event: Delta) -> list[ChoiceDelta]:
    out: list[ChoiceDelta] = []
    if event.reasoning or event.content:
        delta: ChoiceDelta = {}
        if event.reasoning:
            delta["reasoning_content"] = event.reasoning
        if event.content:
            delta["content"] = event.content
        out.append(delta)
    return out + _call_deltas(event.calls, event.first_call)


# -- routes ------------------------------------------------------------------------------
@dataclass(slots=True)
class _LastBody:
    """A session's last valid chat body: what the next one may extend (never changed)."""

    parsed: GrowingBody | None
    request: ChatCompletionRequest
    known: list[Message] | None
    """The stored messages its messages were found to start with (None: they did not)."""
    developer: bool
    """Whether any of its messages has the ``developer`` role."""
    params: SamplingParams
    default_max_tokens: int


@dataclass(slots=True)
class DecodedChat:
    data: dict[str, Any]
    """The body as sent."""
    request: ChatCompletionRequest
    """Its validated request."""
    stored_prefix: list[Message] | None
    """``known`` when the messages were found to start with it."""
    developer: bool
    """Whether any message has the ``developer`` role."""
    params: SamplingParams
    """Its sampling settings (``default_max_tokens`` when it sets no maximum)."""


def decode_chat(body: bytes, known: list[Message], max_depth: int,
                api_state: dict[str, Any], default_max_tokens: int) -> DecodedChat:
    """Parse and validate a chat body. A body that extends the session's last one is
    parsed and validated only past it (:mod:`tito.server.growing_body`), and its earlier
    messages, the same objects as last time, are neither compared with ``known`` (the
    session's stored messages) nor scanned again; when its other members are byte for byte
    the last body's, so are its request fields and sampling settings. ``api_state``: the
    session's, where the last body is kept."""
    last: _LastBody | None = api_state.get("chat_body")
    parsed = decode_growing(body, "messages", None if last is None else last.parsed)
    reused = parsed.extended if last is not None else 0
    equal = 0
    if reused and last is not None and last.known is not None:
        # the reused messages equalled last.known; still so if the session's stored
        # messages start with the same (they are the same objects unless it rolled back)
        equal = min(reused, len(last.known), len(known))
        if known[:equal] != last.known[:equal]:
            equal = 0
    chat, verified = validate_chat(parsed.data, known=known, max_depth=max_depth,
                                   same_as=last.request if last and parsed.same_rest else None,
                                   equal_prefix=equal)
    messages = parsed.data["messages"]
    if verified and parsed.state is not None:
        # the client's copies of stored messages (the replies it sends back) give way to
        # the stored objects when they are the same JSON: the state keeps one copy
        for i in range(reused, min(len(messages), len(known))):
            if messages[i] is not known[i]:
                share(parsed, i, known[i])
    developer = (last.developer or has_developer(messages[reused:])) if reused and last \
        else has_developer(messages)
    if last is not None and parsed.same_rest and last.default_max_tokens == default_max_tokens:
        params = last.params
    else:
        params = sampling_params(chat, default_max_tokens=default_max_tokens)
    api_state["chat_body"] = _LastBody(parsed.state, chat, known if verified else None,
                                       developer, params, default_max_tokens)
    return DecodedChat(parsed.data, chat, known if verified else None, developer, params)


async def chat_completions(gateway: Gateway, request: Request) -> Response:
    session = gateway.session(request.path_params["session_id"])
    known, depth = list(session.messages), gateway.config.max_json_depth
    default_max_tokens = gateway.config.default_max_tokens
    raw, heavy, decoded = await read_turn_body(gateway, request, lambda body: decode_chat(
        body, known, depth, session.api_state, default_max_tokens))
    data, chat, params = decoded.data, decoded.request, decoded.params
    turn = turn_request(data, chat, decoded.stored_prefix, decoded.developer)
    response_id = f"chatcmpl-{os.urandom(16).hex()}"
    if chat.stream:
        stream = await cancel_on_disconnect(request, open_turn_stream(
            gateway, session, turn, params, heavy=heavy, response_id=response_id,
            route=route_of(request)))
        include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
        return sse_response(live_events(stream, gateway, response_id, include_usage))
    body = await run_api_turn(
        gateway, request, session, raw, turn, params, heavy=heavy, response_id=response_id,
        build=lambda outcome: completion(outcome, gateway.model_name))
    return reply(body, chat)


def reply(body: ChatCompletion, chat: ChatCompletionRequest) -> Response:
    """``body`` as JSON, or as the SSE stream the request asked for."""
    if chat.stream:
        include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
        return sse_response(stream_events(body, include_usage))
    return Response(CHAT_COMPLETION.dump(body), media_type=JSON)


async def list_models(gateway: Gateway, request: Request) -> Response:
    gateway.session(request.path_params["session_id"])
    body: ModelList = {"object": "list", "data": [{
        "id": gateway.model_name, "object": "model", "created": int(gateway.started_at),
        "owned_by": "tito", "max_model_len": gateway.config.max_seq_len}]}
    return Response(MODEL_LIST.dump(body), media_type=JSON)
