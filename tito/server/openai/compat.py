"""What a chat reply adds for clients of the reference framework's session server
(docs/miles.md): ``choices[0].meta_info`` (the engine's facts of the turn, replay payloads
left out) and its one-chunk stream (``--compat miles``)."""

from __future__ import annotations

from typing import Any

import orjson

from tito.server.gateway import TurnOutcome
from tito.server.openai.events import DONE
from tito.server.openai.models import ChatCompletion

SETTINGS = ("max_tokens", "max_completion_tokens", "max_new_tokens", "temperature", "top_p",
            "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
            "stop", "stop_token_ids", "seed", "response_format", "tool_choice")
"""The request fields a turn's record keeps as its ``settings`` (when the request sets
them): what the reference keeps of a request besides its messages."""


def request_settings(data: dict[str, Any]) -> dict[str, Any] | None:
    """The sampling settings ``data`` (a chat body) sets explicitly, or None."""
    return {k: data[k] for k in SETTINGS if data.get(k) is not None} or None


def meta_info(outcome: TurnOutcome) -> dict[str, Any]:
    """SGLang's ``meta_info`` of the turn, as the reference passes it to its clients:
    without ``routed_experts`` / ``indexer_topk`` (those stay in the session)."""
    result = outcome.result
    meta: dict[str, Any] = {
        "id": outcome.response_id,
        "finish_reason": {"type": result.finish_reason},
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": len(result.output_ids),
        "cached_tokens": result.cached_tokens,
        "weight_version": result.weight_version,
        "e2e_latency": result.e2e_latency,
        "output_token_logprobs": [[lp, tid, None] for lp, tid
                                  in zip(result.logprobs, result.output_ids, strict=True)],
    }
    if result.weight_versions:  # the weights changed while it ran: SGLang's spans
        meta["weight_versions"] = [{"version": s.version, "start": s.start, "end": s.end}
                                   for s in result.weight_versions]
    if result.spec_info:  # speculative decoding: the engine's counters, as sent
        meta.update(result.spec_info)
    return meta


def with_meta_info(body: ChatCompletion, outcome: TurnOutcome) -> ChatCompletion:
    body["choices"][0]["meta_info"] = meta_info(outcome)
    return body


def one_chunk(body: ChatCompletion) -> bytes:
    """The whole reply as the reference streams it: one ``chat.completion.chunk`` event
    (the message as its delta, each tool call whole with its ``index``, no ``meta_info``),
    then ``[DONE]``."""
    choice = body["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if "reasoning_content" in message:
        delta["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call}
                               for i, call in enumerate(message["tool_calls"])]
    chunk = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"],
             "model": body["model"], "usage": body["usage"],
             "choices": [{"index": 0, "delta": delta, "logprobs": None,
                          "finish_reason": choice["finish_reason"]}]}
    return b"data: " + orjson.dumps(chunk) + b"\n\n" + DONE
