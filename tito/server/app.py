"""The HTTP layer (Starlette): routes of DESIGN 7, thin over :class:`Gateway`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tito.errors import BadRequest, NotFound, TitoError
from tito.server.errors import json_response, openai_error, read_json
from tito.server.gateway import Gateway
from tito.server.openai_api import completion_body, stream_events
from tito.server.schemas import parse_chat_request, session_messages
from tito.session.linear import LinearSession, TurnRequest

log = logging.getLogger("tito.server")
Handler = Callable[[Request], Awaitable[Response]]
MAX_PAGE = 1000
PAGE_ID_BUDGET = 65_536
"""With ``include_ids``, a page stops before its records' ids exceed this many tokens
(at least one record is always returned), so no reply grows to many megabytes."""


def _guard(gateway: Gateway, handler: Callable[[Gateway, Request], Awaitable[Response]]
           ) -> Handler:
    """Run ``handler``; every error leaves as an OpenAI-shaped JSON error."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(gateway, request)
        except TitoError as exc:
            gateway.metrics.error(exc.status, exc.code)
            return openai_error(exc)
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.url.path)
            gateway.metrics.error(500, "internal_error")
            return openai_error(TitoError("internal server error; see the gateway log"))

    return endpoint


def _session(gateway: Gateway, request: Request) -> LinearSession:
    return gateway.store.get(request.path_params["session_id"])


async def health(gateway: Gateway, request: Request) -> Response:
    return json_response({
        "status": "ok",
        "instance_id": gateway.instance_id,
        "engine": {"name": gateway.engine.name,
                   "url": getattr(gateway.engine, "url", None)},
        "family": gateway.renderer.family,
        "session_version": gateway.config.session_version,
        "message_matcher": gateway.config.message_matcher,
        "sessions": len(gateway.store),
        "capabilities": {
            **gateway.renderer.capability_report(),
            "append_only_verified": bool(gateway.self_check.get("passed")),
            "self_check": gateway.self_check,
        },
    })


async def metrics(gateway: Gateway, request: Request) -> Response:
    text = gateway.metrics.render({"sessions": len(gateway.store),
                                   "sessions_expired_total": gateway.store.expired_total})
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def create_session(gateway: Gateway, request: Request) -> Response:
    session = gateway.store.create()
    gateway.metrics.inc("sessions_created_total")
    return json_response({"session_id": session.session_id})


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise BadRequest(f"query parameter {name} must be in [{low}, {high}], got {value}")
    return value


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "false").lower() in ("1", "true", "yes")


async def get_session(gateway: Gateway, request: Request) -> Response:
    """Records (paged: ``offset``, ``limit`` <= 1000) and metadata; ids only on request."""
    session = _session(gateway, request)
    offset = _int_param(request, "offset", 0, 0, 1 << 31)
    limit = _int_param(request, "limit", 100, 1, MAX_PAGE)
    include_ids = _flag(request, "include_ids")
    page = session.records[offset : offset + limit]
    if include_ids:
        ids_in_page = 0
        for n, rec in enumerate(page):
            ids_in_page += len(rec.bridge_ids) + len(rec.output_ids)
            if n and ids_in_page > PAGE_ID_BUDGET:
                page = page[:n]
                break
    end = offset + len(page)
    records = []
    for rec in page:
        item: dict[str, Any] = {
            "turn": rec.turn,
            "prompt_len": rec.prompt_len,
            "bridge_len": len(rec.bridge_ids),
            "drop": rec.drop,
            "output_len": len(rec.output_ids),
            "finish_reason": rec.finish_reason,
            "weight_version": rec.weight_version,
            "cached_tokens": rec.cached_tokens,
            "e2e_latency": rec.e2e_latency,
            "request_ts": rec.request_ts,
            "commit_ts": rec.commit_ts,
            **rec.request,
        }
        if include_ids:
            item.update(bridge_ids=rec.bridge_ids, output_ids=rec.output_ids,
                        logprobs=rec.logprobs)
        records.append(item)
    body: dict[str, Any] = {
        "session_id": session.session_id,
        "records": records,
        "page": {"offset": offset, "limit": limit, "total": len(session.records),
                 "next_offset": end if end < len(session.records) else None},
        "metadata": {
            "session_version": session.version,
            "family": gateway.renderer.family,
            "num_turns": len(session.records),
            "num_messages": len(session.messages),
            "num_tokens": session.num_tokens,
            "turn_in_progress": session.in_flight,
            "created_at": session.created_at,
            "last_active": session.last_active,
        },
    }
    if _flag(request, "include_messages"):
        body["messages"] = session.messages[offset : offset + limit]  # message indices
    return json_response(body)


async def delete_session(gateway: Gateway, request: Request) -> Response:
    gateway.store.delete(request.path_params["session_id"])
    return Response(status_code=204)


async def chat_completions(gateway: Gateway, request: Request) -> Response:
    session = _session(gateway, request)
    data = await read_json(request, gateway.config.max_body_bytes)
    chat = parse_chat_request(data, known=session.messages)
    turn = TurnRequest(
        messages=session_messages(data),
        tools=data.get("tools") or None,
        template_kwargs=chat.chat_template_kwargs,
    )
    params = chat.sampling(default_max_tokens=gateway.config.default_max_tokens)
    outcome = await gateway.run_turn(session, turn, params)
    body = completion_body(outcome, gateway.model_name)
    if chat.stream:
        include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
        return StreamingResponse(stream_events(body, include_usage),
                                 media_type="text/event-stream",
                                 headers={"cache-control": "no-cache",
                                          "x-accel-buffering": "no"})
    return json_response(body)


async def list_models(gateway: Gateway, request: Request) -> Response:
    _session(gateway, request)
    return json_response({"object": "list", "data": [{
        "id": gateway.model_name, "object": "model", "created": int(gateway.started_at),
        "owned_by": "tito", "max_model_len": gateway.config.max_seq_len,
    }]})


async def samples(gateway: Gateway, request: Request) -> Response:
    session = _session(gateway, request)
    data = await read_json(request, gateway.config.max_body_bytes, allow_empty=True)
    if not isinstance(data, dict):
        raise BadRequest("samples body must be a JSON object")
    unknown = set(data) - {"max_seq_len", "metadata", "include_response"}
    if unknown:
        raise BadRequest(f"unknown samples field(s): {sorted(unknown)}")
    max_seq_len = data.get("max_seq_len")
    if max_seq_len is not None and (not isinstance(max_seq_len, int)
                                    or isinstance(max_seq_len, bool) or max_seq_len < 1):
        raise BadRequest("max_seq_len must be a positive integer or null")
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("metadata must be an object")
    include_response = data.get("include_response", True)
    if not isinstance(include_response, bool):
        raise BadRequest("include_response must be true or false")
    payload = gateway.samples_payload(session, max_seq_len, metadata,
                                      include_response=include_response)
    return Response(payload, media_type="application/octet-stream")


async def unknown_session_route(gateway: Gateway, request: Request) -> Response:
    _session(gateway, request)
    raise NotFound(f"no route {request.method} {request.url.path}", code="unknown_route")


def create_app(gateway: Gateway) -> Starlette:
    def route(path: str, handler: Callable[[Gateway, Request], Awaitable[Response]],
              methods: list[str]) -> Route:
        return Route(path, _guard(gateway, handler), methods=methods)

    routes = [
        route("/health", health, ["GET"]),
        route("/metrics", metrics, ["GET"]),
        route("/sessions", create_session, ["POST"]),
        route("/sessions/{session_id}", get_session, ["GET"]),
        route("/sessions/{session_id}", delete_session, ["DELETE"]),
        route("/sessions/{session_id}/v1/chat/completions", chat_completions, ["POST"]),
        route("/sessions/{session_id}/v1/models", list_models, ["GET"]),
        route("/sessions/{session_id}/samples", samples, ["POST"]),
        route("/sessions/{session_id}/{path:path}", unknown_session_route,
              ["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "unknown_route", 405: "method_not_allowed"}.get(exc.status_code, "http")
        return openai_error(TitoError(f"{exc.detail}: {request.method} {request.url.path}",
                                      code=code, status=exc.status_code))

    async def sweep_idle_sessions() -> None:
        period = max(1.0, min(60.0, gateway.store.idle_ttl / 4))
        while True:
            await asyncio.sleep(period)
            gateway.store.evict_idle()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(sweep_idle_sessions())
        try:
            yield
        finally:
            sweeper.cancel()
            await gateway.engine.close()

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error},
                     lifespan=lifespan)
