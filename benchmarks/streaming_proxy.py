"""A bare streaming proxy: the floor of a gateway that streams harness-shaped turns.

Same stack as ``tito serve`` and ``passthrough_proxy.py`` (Starlette on uvicorn, one pooled
aiohttp client, orjson, the collector settings of :mod:`tito.heap`). For each API door it
does what any gateway must and nothing more: it parses the client's body (``orjson``, the
whole body every turn), forwards the turn's prompt as ids precomputed by the benchmark
(``POST /bench/ids`` loads them, keyed by the ``x-bench-key`` header; no tokenization, no
template, no state), reads SGLang's stream (``data:`` chunks, cumulative or incremental
text) and writes the door's server-sent events for each chunk: Messages
(``content_block_delta``), Responses (``response.output_text.delta``), Chat
(``chat.completion.chunk``), or one Chat Completions body when not streamed.

    python benchmarks/streaming_proxy.py --upstream http://127.0.0.1:30000 --port 0
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from passthrough_proxy import serve_app

SAMPLING = {"temperature": 1.0, "skip_special_tokens": False, "no_stop_trim": True}
Events = Callable[[str, int], bytes]


def _sse(event: str | None, data: dict[str, Any]) -> bytes:
    head = b"" if event is None else b"event: " + event.encode() + b"\n"
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


# -- the doors' events: (start, one delta, end) -------------------------------------------
def messages_events() -> tuple[list[bytes], Events, Callable[[str, int], list[bytes]]]:
    start = [_sse("message_start", {"type": "message_start", "message": {
        "id": "msg_proxy", "type": "message", "role": "assistant", "content": [],
        "model": "m", "stop_reason": None, "usage": {"input_tokens": 0, "output_tokens": 0}}}),
        _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}})]

    def delta(text: str, _: int) -> bytes:
        return _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": text}})

    def end(text: str, tokens: int) -> list[bytes]:
        return [_sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
                _sse("message_delta", {"type": "message_delta", "delta": {
                    "stop_reason": "end_turn"}, "usage": {"output_tokens": tokens}}),
                _sse("message_stop", {"type": "message_stop"})]
    return start, delta, end


def responses_events() -> tuple[list[bytes], Events, Callable[[str, int], list[bytes]]]:
    response = {"id": "resp_proxy", "object": "response", "status": "in_progress",
                "output": []}
    start = [_sse("response.created", {"type": "response.created", "response": response}),
             _sse("response.output_item.added", {
                 "type": "response.output_item.added", "output_index": 0, "item": {
                     "id": "msg_proxy", "type": "message", "role": "assistant",
                     "content": []}})]

    def delta(text: str, _: int) -> bytes:
        return _sse("response.output_text.delta", {
            "type": "response.output_text.delta", "item_id": "msg_proxy", "output_index": 0,
            "content_index": 0, "delta": text})

    def end(text: str, tokens: int) -> list[bytes]:
        item = {"id": "msg_proxy", "type": "message", "role": "assistant", "status":
                "completed", "content": [{"type": "output_text", "text": text,
                                          "annotations": []}]}
        return [_sse("response.output_item.done", {"type": "response.output_item.done",
                                                   "output_index": 0, "item": item}),
                _sse("response.completed", {"type": "response.completed", "response": {
                    **response, "status": "completed", "output": [item],
                    "usage": {"output_tokens": tokens}}})]
    return start, delta, end


def chat_events() -> tuple[list[bytes], Events, Callable[[str, int], list[bytes]]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "chatcmpl-proxy", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def delta(text: str, _: int) -> bytes:
        return _sse(None, chunk({"content": text}))

    def end(text: str, tokens: int) -> list[bytes]:
        return [_sse(None, chunk({}, "stop")), b"data: [DONE]\n\n"]
    return [_sse(None, chunk({"role": "assistant", "content": ""}))], delta, end


DOORS = {"v1/messages": messages_events, "v1/responses": responses_events,
         "v1/chat/completions": chat_events}


class Proxy:
    """The proxy's routes and its one pooled engine client."""

    def __init__(self, upstream: str, incremental: bool, max_new_tokens: int) -> None:
        self.upstream, self.incremental = upstream, incremental
        self.sampling = {**SAMPLING, "max_new_tokens": max_new_tokens}
        self.ids: dict[str, list[int]] = {}
        self.http: aiohttp.ClientSession | None = None

    def client(self) -> aiohttp.ClientSession:
        if self.http is None or self.http.closed:
            connector = aiohttp.TCPConnector(limit=1024, keepalive_timeout=600)
            self.http = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=600),
                read_bufsize=1 << 20)
        return self.http

    async def chunks(self, ids: list[int]) -> AsyncIterator[tuple[str, int]]:
        """(text so far, tokens so far) per SGLang stream chunk."""
        payload = {"input_ids": ids, "sampling_params": self.sampling,
                   "return_logprob": True, "stream": True}
        text = ""
        async with self.client().post(self.upstream + "/generate", data=orjson.dumps(payload),
                                      headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"engine: HTTP {resp.status}: {await resp.read()!r}")
            async for line in resp.content:
                if not line.startswith(b"data:") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = orjson.loads(line[5:])
                text = text + chunk["text"] if self.incremental else chunk["text"]
                yield text, chunk["meta_info"]["completion_tokens"]

    async def whole(self, ids: list[int]) -> tuple[str, int]:
        """(text, tokens) of a generation not streamed."""
        payload = {"input_ids": ids, "sampling_params": self.sampling, "return_logprob": True}
        async with self.client().post(self.upstream + "/generate", data=orjson.dumps(payload),
                                      headers={"content-type": "application/json"}) as resp:
            reply = orjson.loads(await resp.read())
        if resp.status != 200:
            raise RuntimeError(f"engine: HTTP {resp.status}: {reply!r}")
        return reply["text"], reply["meta_info"]["completion_tokens"]

    async def turn(self, request: Request) -> Response:
        door = request.url.path.lstrip("/")
        data = orjson.loads(await request.body())  # the same body decode as the gateway
        ids = self.ids[request.headers["x-bench-key"]]
        if not data.get("stream"):
            last = await self.whole(ids)
            return Response(orjson.dumps({
                "id": "chatcmpl-proxy", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {
                    "role": "assistant", "content": last[0]}}],
                "usage": {"completion_tokens": last[1]}}), media_type="application/json")
        return StreamingResponse(self.events(DOORS[door](), ids),
                                 media_type="text/event-stream")

    async def events(self, door: tuple[list[bytes], Events, Callable[[str, int], list[bytes]]],
                     ids: list[int]) -> AsyncIterator[bytes]:
        start, delta, end = door
        for event in start:
            yield event
        sent, tokens, text = 0, 0, ""
        async for text, tokens in self.chunks(ids):
            if len(text) > sent:
                yield delta(text[sent:], tokens)
                sent = len(text)
        for event in end(text, tokens):
            yield event

    async def load_ids(self, request: Request) -> Response:
        self.ids.update(orjson.loads(await request.body()))
        return Response(b'{"ok":true}', media_type="application/json")


def create_app(upstream: str, incremental: bool = False, max_new_tokens: int = 8192
               ) -> Starlette:
    proxy = Proxy(upstream, incremental, max_new_tokens)

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    routes = [Route("/" + door, proxy.turn, methods=["POST"]) for door in DOORS]
    return Starlette(routes=[*routes, Route("/bench/ids", proxy.load_ids, methods=["POST"]),
                             Route("/health", health, methods=["GET"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="engine base URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--incremental", action="store_true",
                        help="the engine streams incremental chunks")
    parser.add_argument("--max-new-tokens", type=int, default=8192)
    args = parser.parse_args()
    serve_app(create_app(args.upstream.rstrip("/"), args.incremental, args.max_new_tokens),
              args.host, args.port, "streaming proxy")

if __name__ == "__main__":
    main()
