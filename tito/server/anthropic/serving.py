"""Anthropic Messages serving: ``POST /sessions/<id>/v1/messages`` (and
``/v1/messages/count_tokens``) on the same session core and records as the chat route."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from tito.parse.stream import Delta
from tito.server.anthropic.convert import (
    message_reply,
    sampling_params,
    signature,
    tool_use_block,
    turn_request,
)
from tito.server.anthropic.decode import decode_messages
from tito.server.anthropic.errors import TYPE, status_of
from tito.server.anthropic.models import (
    MESSAGE,
    TOKEN_COUNT,
    CountTokensRequest,
    MessageReply,
    ToolUseBlock,
    parse_request,
)
from tito.server.api import route_of
from tito.server.gateway import Gateway
from tito.server.http import cancel_on_disconnect, read_json
from tito.server.openai.serving import STREAM_PARSE_EVERY
from tito.server.serving import (
    TurnStream,
    open_turn_stream,
    read_turn_body,
    run_api_turn,
    sse_response,
)

JSON = "application/json"


async def messages(gateway: Gateway, request: Request) -> Response:
    session = gateway.session(request.path_params["session_id"])
    known, depth = list(session.messages), gateway.config.max_json_depth
    raw, heavy, (req, turn) = await read_turn_body(
        gateway, request, lambda body: decode_messages(
            body, gateway.renderer, max_depth=depth, api_state=session.api_state,
            known=known))
    response_id = f"msg_{os.urandom(16).hex()}"
    model = req.model or gateway.model_name
    if req.stream:
        stream = await cancel_on_disconnect(request, open_turn_stream(
            gateway, session, turn, sampling_params(req), heavy=heavy,
            response_id=response_id,
            route=route_of(request)))
        return sse_response(live_events(stream, gateway, response_id, model,
                                        req.stop_sequences))
    body = await run_api_turn(
        gateway, request, session, raw, turn, sampling_params(req), heavy=heavy,
        response_id=response_id,
        build=lambda outcome: message_reply(outcome, model, req.stop_sequences))
    return Response(MESSAGE.dump(body), media_type=JSON)


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) \
        + b"\n\n"


class _Blocks:
    """The content blocks of a streamed message: one open at a time, in order."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None
        self.thinking = ""

    def delta(self, kind: str, text: str) -> list[bytes]:
        out = self.switch(kind)
        if kind == "thinking":
            self.thinking += text
            out.append(_event("content_block_delta", {"index": self.index, "delta": {
                "type": "thinking_delta", "thinking": text}}))
        else:
            out.append(_event("content_block_delta", {"index": self.index, "delta": {
                "type": "text_delta", "text": text}}))
        return out

    def switch(self, kind: str | None) -> list[bytes]:
        """Close the open block unless it is of ``kind``; open a ``kind`` block."""
        if self.open == kind and kind is not None:
            return []
        out = self.close()
        if kind is not None:
            self.index += 1
            self.open = kind
            block: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""} \
                if kind == "thinking" else {"type": "text", "text": ""}
            out.append(_event("content_block_start", {"index": self.index,
                                                      "content_block": block}))
        return out

    def close(self) -> list[bytes]:
        out = []
        if self.open == "thinking":
            out.append(_event("content_block_delta", {"index": self.index, "delta": {
                "type": "signature_delta", "signature": signature(self.thinking)}}))
            self.thinking = ""
        if self.open is not None:
            out.append(_event("content_block_stop", {"index": self.index}))
        self.open = None
        return out

    def text(self, delta: Delta) -> list[bytes]:
        out = []
        for kind, text in (("thinking", delta.reasoning), ("text", delta.content)):
            if text:
                out += self.delta(kind, text)
        for call in delta.calls:
            out += self.tool_use(tool_use_block(call))
        return out

    def finish(self, reply: MessageReply) -> list[bytes]:
        """The committed message's stop reason and usage."""
        out = self.close()
        out.append(_event("message_delta", {
            "delta": {"stop_reason": reply["stop_reason"],
                      "stop_sequence": reply["stop_sequence"]},
            "usage": reply["usage"]}))
        out.append(_event("message_stop", {}))
        return out

    def tool_use(self, block: ToolUseBlock) -> list[bytes]:
        out = self.close()
        self.index += 1
        out.append(_event("content_block_start", {"index": self.index, "content_block": {
            "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
        out.append(_event("content_block_delta", {"index": self.index, "delta": {
            "type": "input_json_delta",
            "partial_json": orjson.dumps(block["input"]).decode()}}))
        out.append(_event("content_block_stop", {"index": self.index}))
        return out


async def live_events(stream: TurnStream, gateway: Gateway, response_id: str, model: str,
                      stop_sequences: list[str] | None) -> AsyncIterator[bytes]:
    """A message as the engine generates it, in the Messages API's stream events:
    ``message_start``, thinking and text blocks with their deltas, then (the turn
    committed) ``tool_use`` blocks with ``input_json_delta``, ``message_delta`` (stop
    reason, usage) and ``message_stop``. An error after the first byte is an ``error``
    event."""
    blocks = _Blocks()
    try:
        yield _event("message_start", {"message": {
            "id": response_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}})
        async for event in stream.deltas(gateway.renderer.parse, STREAM_PARSE_EVERY):
            chunks = blocks.text(event) if isinstance(event, Delta) else \
                blocks.finish(message_reply(event, model, stop_sequences))
            for chunk in chunks:
                yield chunk
    except Exception as exc:
        error = stream.failed(exc, status_of)
        yield _event("error", {"error": {"type": TYPE.get(error.kind, "invalid_request_error"),
                                         "message": f"[{error.code}] {error.message}"}})
    finally:
        await stream.aclose()


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
