"""Session routes, the same for every API (design §7): health, metrics, create, view,
delete, samples. Their errors use the OpenAI envelope."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from tito.config import PAUSE_MODES
from tito.server.api import Api
from tito.server.api_state import ApiState
from tito.server.contexts import register_context
from tito.server.errors import error_response, status_of
from tito.server.finish import (
    Snapshot,
    cached_export,
    check_rebuilt,
    export_digest,
    finish,
    finish_query,
    journaled_params,
    params_json,
    snapshot_of,
)
from tito.server.gateway import Gateway
from tito.server.http import int_query, json_response, read_body, read_json
from tito.server.journal import Journal
from tito.server.records import PATH, reference_fields
from tito.server.samples import samples_payload, samples_query, stored_sizes
from tito.server.serving import read_turn_body
from tito.server.session_options import session_options
from tito.session import Session, TurnSession
from tito.types.engine import EngineStats
from tito.types.errors import BadRequest, NotFound
from tito.types.records import TurnRecord, snapshot_ids

MAX_PAGE = 1000
CONTROL_BODY_BYTES = 64 * 1024
"""Largest body of an engine control route (``/pause``, ``/continue``,
``/update_weight_version``): theirs are a few bytes (413 above)."""
MAX_WEIGHT_VERSION_CHARS = 256
"""Longest ``new_version``: every later turn's record and sample carries it."""
PAGE_ID_BUDGET = 65_536
"""With ``include_ids``, a page stops before its records' ids exceed this many tokens
(at least one record is always returned), so no reply grows to many megabytes."""


async def health(gateway: Gateway, request: Request) -> Response:
    """200 ``ok``; 503 ``degraded`` (same body) while the engine does not answer or the
    journal cannot write; 200 ``degraded`` while another worker of ``--workers N`` is down
    (this one serves)."""
    engine_error = await gateway.control.engine_state()
    stats = gateway.engine.stats()
    peers = gateway.peers
    if peers is not None:
        await peers.check()
    journal = gateway.journal
    ok = engine_error is None and (journal is None or journal.failed is None)
    degraded = not ok or (peers is not None and bool(peers.down))
    return json_response({
        "status": "degraded" if degraded else "ok",
        "instance_id": gateway.instance_id,
        "session_server_instance_id": gateway.instance_id,  # the reference's name
        "engine": {"name": gateway.engine.name, "url": stats.url,
                   "ok": engine_error is None, "error": engine_error,
                   **_pool_view(stats)},
        "family": gateway.renderer.family,
        "session_version": gateway.config.session_version,
        "paused": gateway.control.pause_mode,
        "pause_generation_mode": gateway.config.pause_generation_mode,
        "routing_replay": {"enabled": gateway.config.routing_replay,
                           "incremental": gateway.config.incremental_routing,
                           "layers": gateway.routing.layers, "top_k": gateway.routing.top_k},
        "sampling_mask_replay": gateway.config.sampling_mask_replay,
        "weight_versions_format": gateway.config.weight_versions_format,
        "message_matcher": gateway.config.message_matcher,
        "sessions": len(gateway.store),
        **({} if peers is None else {"workers": peers.view()}),
        **({} if journal is None else {"journal": journal_view(journal)}),
        "capabilities": {
            **gateway.renderer.capability_report(),
            "append_only_verified": bool(gateway.self_check.get("passed")),
            "fast_encoder": gateway.renderer.tokenizer.fast is not None,
            "fast_encoder_state": gateway.renderer.tokenizer.fast_state,
            "self_check": gateway.self_check,
        },
    }, status=200 if ok else 503)


def journal_view(journal: Journal) -> dict[str, Any]:
    """The journal on /health: whether it writes, its size, what the last start found."""
    report = journal.report
    return {"ok": journal.failed is None, "error": journal.failed, "path": str(journal.path),
            "bytes": journal.size, "live_bytes": journal.live_bytes,
            "compactions": journal.compactions,
            "recovery": None if report is None or report.clean else {
                "damaged_ranges": len(report.damage),
                "affected_sessions": sorted(report.affected),
                "torn_tail_bytes": 0 if report.tail is None
                else report.tail.end - report.tail.start,
                "legacy": report.legacy}}


def _pool_view(stats: EngineStats) -> dict[str, Any]:
    """An engine pool's members on /health: URL, up, in flight, sessions."""
    if not stats.members:
        return {}
    return {"engines": [{"url": m.url, "up": m.up, "inflight": m.inflight,
                         "sessions": m.sessions} for m in stats.members]}


async def metrics(gateway: Gateway, request: Request) -> Response:
    gauges: dict[str, float] = {"sessions": len(gateway.store),
                                "sessions_expired_total": gateway.store.expired_total}
    # a walk over every live record: off the event loop (a gauge may be a moment stale)
    gauges.update(await gateway.offload(stored_sizes, gateway))
    if gateway.journal is not None:
        gauges["journal_fsyncs_total"] = gateway.journal.syncs
        gauges["journal_frames_total"] = gateway.journal.frames_written
        gauges["journal_compactions_total"] = gateway.journal.compactions
        gauges["journal_bytes"] = gateway.journal.size
        gauges["journal_failed"] = int(gateway.journal.failed is not None)
    stats = gateway.engine.stats()
    # requests resent after an idle-closed pooled connection (a pool: all its engines')
    gauges["engine_stale_retries_total"] = stats.stale_retries
    text = gateway.metrics.render(gauges, stats.member_figures())  # a pool: per engine
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def create_session(gateway: Gateway, request: Request) -> Response:
    """A new session; the optional body sets sampling defaults and ``evaluation``
    (:mod:`tito.server.session_options`; a bad body is a 400 and creates nothing)."""
    raw = await read_body(request, _control_limit(gateway))
    options = session_options(raw) if raw.strip() else None
    session = await gateway.create_session(options)
    reply: dict[str, Any] = {"session_id": session.session_id}
    if options is not None:
        reply.update(options.view())
    return json_response(reply)


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "false").lower() in ("1", "true", "yes")


async def get_session(gateway: Gateway, request: Request) -> Response:
    """Records (paged: ``offset``, ``limit`` <= 1000) and metadata; ids only on request;
    ``context``: one agent context's instead of the main agent's (design §5.5)."""
    whole = gateway.session(request.path_params["session_id"])
    session: TurnSession = whole
    details = whole.details()  # the contexts, when the session has several
    context = request.query_params.get("context")
    if context is not None:
        session = whole.agent_context(context)
        details = {**session.details(), "context_id": context}
    offset = int_query(request, "offset", 0, 0, 1 << 31)
    limit = int_query(request, "limit", 100, 1, MAX_PAGE)
    include_ids = _flag(request, "include_ids")
    full = _flag(request, "include_requests") or gateway.config.compat == "miles"
    page = session.records[offset : offset + limit]
    if include_ids:
        ids_in_page = 0
        for n, rec in enumerate(page):
            ids_in_page += len(rec.bridge_ids) + len(rec.output_ids)
            if n and ids_in_page > PAGE_ID_BUDGET:
                page = page[:n]
                break
    end = offset + len(page)
    body: dict[str, Any] = {
        "session_id": session.session_id,
        "records": [_record_item(rec, include_ids) for rec in page],
        "page": {"offset": offset, "limit": limit, "total": len(session.records),
                 "next_offset": end if end < len(session.records) else None},
        "metadata": {
            "session_version": session.version,
            "family": gateway.renderer.family,
            "num_turns": len(session.records),
            "num_messages": len(session.messages),
            "num_tokens": session.num_tokens,
            "turn_in_progress": session.in_flight,
            "created_at": whole.created_at,
            "last_active": session.last_active,
        },
    }
    body["metadata"].update(details)  # a tree's: the records are its active path's
    if full:  # the reference's request and response of each record (cost: docs/http.md)
        messages = session.messages
        for item, rec in zip(body["records"], page, strict=True):
            item.update(reference_fields(rec, messages, gateway.model_name, include_ids))
            item["generation_id"] = rec.generation_id
        body["metadata"]["accumulated_token_ids"] = snapshot_ids(session.records).tolist()
    body["metadata"].update(lifecycle_view(whole))
    if _flag(request, "include_messages"):
        body["messages"] = session.messages[offset : offset + limit]  # message indices
    return json_response(body)


def _record_item(rec: TurnRecord, include_ids: bool) -> dict[str, Any]:
    """One record as ``GET /sessions/<id>`` lists it."""
    item: dict[str, Any] = {
        "turn": rec.turn,
        "path": PATH,  # the reference's: every record is a chat completion
        "status_code": 200,
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
    if rec.links is not None:  # X-Miles-Previous-Response-Id, -Retry-Of, -Supersedes
        item.update(rec.links)
    if include_ids:
        item.update(bridge_ids=rec.bridge_ids, output_ids=rec.output_ids,
                    logprobs=rec.logprobs)
    return item


async def delete_session(gateway: Gateway, request: Request) -> Response:
    await gateway.delete_session(request.path_params["session_id"])
    return Response(status_code=204)


async def samples(gateway: Gateway, request: Request) -> Response:
    """The session's samples (design §6); a body over ``OFFLOAD_BYTES`` (a big
    ``metadata``) is decoded and checked in the worker pool, as the samples are built.
    With ``snapshot_id``: the snapshot a finish sealed, its first export kept."""
    session = gateway.session(request.path_params["session_id"])
    depth = gateway.config.max_json_depth
    _, _, query = await read_turn_body(gateway, request,
                                       lambda raw: samples_query(raw, max_depth=depth))
    if query.snapshot_id is None:
        payload = await samples_payload(gateway, session, query.max_seq_len, query.metadata,
                                        include_response=query.include_response,
                                        weight_versions_format=query.weight_versions_format)
        return Response(payload, media_type="application/octet-stream")
    snapshot = snapshot_of(session, query.snapshot_id)
    params = query.export_params()
    cached = cached_export(snapshot, params)
    if cached is None:
        params = journaled_params(snapshot) or params  # rebuilt as it was first asked
        max_seq_len, metadata, include_response, wv_format = params
        cached = await samples_payload(
            gateway, session, max_seq_len, metadata, include_response=include_response,
            collection=snapshot.collection, incomplete=not snapshot.complete,
            instance_id=snapshot.instance_id, weight_versions_format=wv_format)
        check_rebuilt(snapshot, params, cached)
        if snapshot.export is None:  # two first exports at once: the first one is kept
            snapshot.export = (params, cached)
            await _journal_export(gateway, session, snapshot, params, cached)
        cached = cached_export(snapshot, params) or cached
    return Response(cached, media_type="application/octet-stream")


async def _journal_export(gateway: Gateway, session: Session, snapshot: Snapshot,
                          params: tuple[Any, ...], payload: bytes) -> None:
    """Journal a snapshot's first export (its parameters and digest, not its bytes: a
    restart rebuilds them from the replayed turns and checks them)."""
    if gateway.journal is None or snapshot.journaled is not None:
        return
    snapshot.journaled = (params_json(params), export_digest(payload))
    await gateway.journal.session_event(session.session_id, {
        "op": "export", "params": snapshot.journaled[0].decode(),
        "digest": snapshot.journaled[1]})


async def finish_session(gateway: Gateway, request: Request) -> Response:
    """Close admission, wait for the admitted turns, seal a snapshot (idempotent)."""
    session = gateway.session(request.path_params["session_id"])
    query = finish_query(await read_body(request, _control_limit(gateway)))
    return json_response(await finish(gateway, session, query))


def lifecycle_view(session: Session) -> dict[str, Any]:
    """The session's options and finish, as ``GET /sessions/<id>`` shows them."""
    state = ApiState.of(session)
    view: dict[str, Any] = {} if state.options is None else state.options.view()
    if state.finish is not None:
        snapshot = state.finish.snapshot()
        view["finish"] = {"sealed": False} if snapshot is None else snapshot.reply
    return view


async def pause(gateway: Gateway, request: Request) -> Response:
    """Pause the engine (SGLang's ``/pause_generation``); new turns are held meanwhile."""
    data = await read_json(request, _control_limit(gateway), allow_empty=True)
    if not isinstance(data, dict) or set(data) - {"mode"}:
        raise BadRequest('pause body must be {"mode": "retract" | "abort" | "in_place"} or '
                         "empty (the --pause-generation-mode)")
    mode = data.get("mode")
    if mode is not None and mode not in PAUSE_MODES:
        raise BadRequest(f"unknown pause mode {mode!r}; use one of {', '.join(PAUSE_MODES)}")
    used = await gateway.control.pause(mode)
    return json_response({"status": "ok", "paused": True, "mode": used})


async def resume(gateway: Gateway, request: Request) -> Response:
    """Continue generation (SGLang's ``/continue_generation``); held turns proceed."""
    await read_body(request, _control_limit(gateway))  # SGLang's options: ignored
    await gateway.control.resume()
    return json_response({"status": "ok", "paused": False})


async def update_weight_version(gateway: Gateway, request: Request) -> Response:
    """Forward ``{"new_version": str}`` to the engine: later turns record that version
    (at most :data:`MAX_WEIGHT_VERSION_CHARS` printable characters)."""
    data = await read_json(request, _control_limit(gateway))
    version = data.get("new_version") if isinstance(data, dict) else None
    if not isinstance(version, str) or not version:
        raise BadRequest('update_weight_version body must be {"new_version": "<version>"}')
    if len(version) > MAX_WEIGHT_VERSION_CHARS:
        raise BadRequest(f"new_version has {len(version)} characters, over the limit of "
                         f"{MAX_WEIGHT_VERSION_CHARS}")
    if not version.isprintable():
        raise BadRequest("new_version has a control character (a version is printable "
                         "text: every record and sample carries it)")
    await gateway.control.update_weight_version(version)
    return json_response({"success": True, "new_version": version})


def _control_limit(gateway: Gateway) -> int:
    return min(CONTROL_BODY_BYTES, gateway.config.max_body_bytes)


async def unknown_session_route(gateway: Gateway, request: Request) -> Response:
    gateway.session(request.path_params["session_id"])
    raise NotFound(f"no route {request.method} {request.url.path}", code="unknown_route")


API = Api(
    name="sessions",
    status_of=status_of,
    error_response=error_response,
    routes=[
        ("/health", health, ["GET"]),
        ("/metrics", metrics, ["GET"]),
        ("/sessions", create_session, ["POST"]),
        ("/sessions/{session_id}", get_session, ["GET"]),
        ("/sessions/{session_id}", delete_session, ["DELETE"]),
        ("/sessions/{session_id}/samples", samples, ["POST"]),
        ("/sessions/{session_id}/finish", finish_session, ["POST"]),
        ("/sessions/{session_id}/contexts", register_context, ["POST"]),
        ("/pause", pause, ["POST"]),
        ("/pause_generation", pause, ["POST"]),
        ("/continue", resume, ["POST"]),
        ("/continue_generation", resume, ["POST"]),
        ("/update_weight_version", update_weight_version, ["POST"]),
    ],
)
CATCH_ALL = ("/sessions/{session_id}/{path:path}", unknown_session_route,
             ["GET", "POST", "PUT", "DELETE", "PATCH"])
"""Last route: a known session with an unknown path is 404 ``unknown_route``."""
