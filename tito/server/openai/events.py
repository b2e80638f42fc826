"""Chat Completions stream events: a turn as ``chat.completion.chunk`` s while the engine
generates — content and reasoning deltas, each tool call once it is complete — then (the
turn committed) the rest, the finish reason, usage and ``[DONE]``. An error after the first
byte is one ``data: {"error": ...}`` event (framed by :func:`tito.server.adapter.framed`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from tito.parse.stream import Delta
from tito.server.gateway import TurnOutcome
from tito.server.openai.models import (
    CHAT_COMPLETION_CHUNK,
    ChatCompletion,
    ChatCompletionChunk,
    ChoiceDelta,
    ChunkChoice,
    ToolCallOut,
)
from tito.server.serving import TurnStream

DONE = b"data: [DONE]\n\n"


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


async def live_events(stream: TurnStream, parse: Any, model: str, response_id: str,
                      include_usage: bool, reply: Callable[[TurnOutcome], ChatCompletion]
                      ) -> AsyncGenerator[bytes, None]:
    """The turn's chunks (the role first), then the finish reason and usage."""
    created = int(time.time())
    yield _sse(_chunk(response_id, created, model, {"role": "assistant", "content": ""}))
    async for event in stream.deltas(parse):
        if isinstance(event, Delta):
            for delta in _text_and_calls(event):
                yield _sse(_chunk(response_id, created, model, delta))
            continue
        body = reply(event)
        yield _sse(_chunk(response_id, created, model, {},
                          body["choices"][0]["finish_reason"]))
        if include_usage:
            last = _chunk(response_id, created, model, None)
            last["usage"] = body["usage"]
            yield _sse(last)


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
