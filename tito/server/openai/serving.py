"""OpenAI Chat Completions serving: request -> core turn, turn outcome -> response.

``POST /sessions/<id>/v1/chat/completions`` validates the body
(:mod:`tito.server.openai.models`), converts it into a :class:`TurnRequest` and
:class:`SamplingParams`, runs the turn on the :class:`Gateway`, and renders the
:class:`TurnOutcome` as a ``chat.completion`` or, with ``stream: true``, as SSE chunks.
``GET /sessions/<id>/v1/models`` lists the served model.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tito.server.gateway import Gateway, TurnOutcome
from tito.server.http import read_json
from tito.server.openai.models import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChoiceDelta,
    ChunkChoice,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    ToolCallDelta,
    Usage,
    parse_chat_request,
)
from tito.types.engine import SamplingParams
from tito.types.messages import Message, TurnRequest

JSON = "application/json"


# -- request -> core ---------------------------------------------------------------------
def session_messages(data: dict[str, Any]) -> list[Message]:
    """The client's messages as sent, with ``developer`` read as ``system``."""
    out = []
    for message in data["messages"]:
        if message.get("role") == "developer":
            message = {**message, "role": "system"}
        out.append(message)
    return out


def turn_request(data: dict[str, Any], chat: ChatCompletionRequest) -> TurnRequest:
    return TurnRequest(messages=session_messages(data), tools=data.get("tools") or None,
                       template_kwargs=chat.chat_template_kwargs)


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
def usage(outcome: TurnOutcome) -> Usage:
    completion = len(outcome.result.output_ids)
    return Usage(prompt_tokens=outcome.prompt_tokens, completion_tokens=completion,
                 total_tokens=outcome.prompt_tokens + completion,
                 prompt_tokens_details=PromptTokensDetails(
                     cached_tokens=outcome.result.cached_tokens))


def completion(outcome: TurnOutcome, model: str) -> ChatCompletion:
    parsed = outcome.parsed
    message = AssistantMessage.model_validate({
        "content": parsed.content, "reasoning_content": parsed.reasoning_content,
        "tool_calls": parsed.tool_calls or None,
    })
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=model,
        choices=[Choice(message=message, finish_reason=parsed.finish_reason)],
        usage=usage(outcome),
    )


def _sse(chunk: ChatCompletionChunk) -> bytes:
    return b"data: " + chunk.model_dump_json().encode() + b"\n\n"


async def stream_events(body: ChatCompletion, include_usage: bool) -> AsyncIterator[bytes]:
    """The whole completion as one ``chat.completion.chunk`` (+ usage chunk) and ``[DONE]``.

    Generation is not streamed token by token: TITO needs the complete output ids before
    it can parse and commit the turn, so the stream carries the finished message at once.
    """
    choice = body.choices[0]
    message = choice.message
    calls = [ToolCallDelta(index=i, **call.model_dump())
             for i, call in enumerate(message.tool_calls or [])]
    delta = ChoiceDelta(content=message.content, reasoning_content=message.reasoning_content,
                        tool_calls=calls or None)
    head: dict[str, Any] = {"id": body.id, "created": body.created, "model": body.model}
    yield _sse(ChatCompletionChunk(**head, choices=[
        ChunkChoice(delta=delta, finish_reason=choice.finish_reason)]))
    if include_usage:
        yield _sse(ChatCompletionChunk(**head, choices=[], usage=body.usage))
    yield b"data: [DONE]\n\n"


# -- routes ------------------------------------------------------------------------------
async def chat_completions(gateway: Gateway, request: Request) -> Response:
    session = gateway.session(request.path_params["session_id"])
    data = await read_json(request, gateway.config.max_body_bytes)
    chat = parse_chat_request(data, known=session.messages)
    params = sampling_params(chat, default_max_tokens=gateway.config.default_max_tokens)
    outcome = await gateway.run_turn(session, turn_request(data, chat), params)
    body = completion(outcome, gateway.model_name)
    if chat.stream:
        include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
        return StreamingResponse(stream_events(body, include_usage),
                                 media_type="text/event-stream",
                                 headers={"cache-control": "no-cache",
                                          "x-accel-buffering": "no"})
    return Response(body.model_dump_json(), media_type=JSON)


async def list_models(gateway: Gateway, request: Request) -> Response:
    gateway.session(request.path_params["session_id"])
    card = ModelCard(id=gateway.model_name, created=int(gateway.started_at),
                     max_model_len=gateway.config.max_seq_len)
    return Response(ModelList(data=[card]).model_dump_json(), media_type=JSON)
