"""A turn record in the reference framework's shape (docs/http.md#get-sessionsid):
``path``, ``status_code``, and on request ``request`` (the messages the turn was generated
from and its explicit settings) and ``response`` (the reply: the assistant message, the
finish reason, usage and the engine's ``meta_info``).

Nothing is stored for this but the message count after the turn (``message_end``) and the
request's explicit settings: the messages are the session's own, sliced; the rest is the
record's."""

from __future__ import annotations

import base64
from typing import Any

from tito.types.messages import Message
from tito.types.records import TurnRecord

PATH = "/v1/chat/completions"


def reference_fields(rec: TurnRecord, messages: list[Message], model: str,
                     include_ids: bool) -> dict[str, Any]:
    """``request`` and ``response`` of ``rec`` (``messages``: its path's); empty when the
    record predates ``message_end`` (a journal of an older tito)."""
    end = rec.request.get("message_end")
    if not isinstance(end, int) or not 0 < end <= len(messages):
        return {}
    request: dict[str, Any] = {"messages": messages[: end - 1],
                               **(rec.request.get("settings") or {})}
    if rec.request.get("chat_template_kwargs"):
        request["chat_template_kwargs"] = rec.request["chat_template_kwargs"]
    message = messages[end - 1]
    finish = "tool_calls" if message.get("tool_calls") and rec.finish_reason == "stop" \
        else rec.finish_reason
    output = len(rec.output_ids)
    return {"request": request, "response": {
        "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish,
                     "meta_info": _meta_info(rec, include_ids)}],
        "usage": {"prompt_tokens": rec.prompt_len, "completion_tokens": output,
                  "total_tokens": rec.prompt_len + output}}}


def _meta_info(rec: TurnRecord, include_ids: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "finish_reason": {"type": rec.finish_reason},
        "prompt_tokens": rec.prompt_len, "completion_tokens": len(rec.output_ids),
        "cached_tokens": rec.cached_tokens, "weight_version": rec.weight_version,
        "e2e_latency": rec.e2e_latency,
        "output_token_logprobs": [[float(lp), int(t), None] for lp, t
                                  in zip(rec.logprobs, rec.output_ids, strict=True)],
    }
    if rec.weight_spans:
        meta["weight_versions"] = [{"version": v, "start": a, "end": b}
                                   for v, a, b in rec.weight_spans]
    if rec.spec_info:
        meta.update(rec.spec_info)
    if include_ids:  # the replay payloads: megabytes on a big MoE
        for key, rows, start in (("routed_experts", rec.routed_experts,
                                  rec.routed_experts_start_len),
                                 ("indexer_topk", rec.indexer_topk, rec.indexer_topk_start_len)):
            if rows is not None:
                meta[key] = base64.b64encode(rows.tobytes()).decode("ascii")
                meta[f"{key}_start_len"] = start
    return meta
