"""OpenAI Chat Completions: request -> turn, outcome -> response / one-chunk SSE stream."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson

from tito.server.gateway import TurnOutcome


def completion_body(outcome: TurnOutcome, model: str) -> dict[str, Any]:
    parsed = outcome.parsed
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning_content is not None:
        message["reasoning_content"] = parsed.reasoning_content
    if parsed.tool_calls:
        message["tool_calls"] = parsed.tool_calls
    completion_tokens = len(outcome.result.output_ids)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": parsed.finish_reason,
        }],
        "usage": usage(outcome.prompt_tokens, completion_tokens, outcome.result.cached_tokens),
    }


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


async def stream_events(body: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
    """The whole completion as one ``chat.completion.chunk`` (+ usage chunk) and ``[DONE]``.

    Generation is not streamed token by token: TITO needs the complete output ids before
    it can parse and commit the turn, so the stream carries the finished message at once.
    """
    choice = body["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if "reasoning_content" in message:
        delta["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call}
                               for i, call in enumerate(message["tool_calls"])]
    head = {k: body[k] for k in ("id", "created", "model")}
    yield _sse({**head, "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": choice["finish_reason"]}
    ]})
    if include_usage:
        yield _sse({**head, "object": "chat.completion.chunk", "choices": [],
                    "usage": body["usage"]})
    yield b"data: [DONE]\n\n"
