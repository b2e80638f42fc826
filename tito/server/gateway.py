"""The gateway service: sessions + renderer + engine, independent of any API's shape.

Each API module (:mod:`tito.server.openai`, ...) converts its request into a
:class:`tito.types.messages.TurnRequest`, calls :meth:`Gateway.run_turn`, and renders the
:class:`TurnOutcome` in its own response shape (design §3.2: the code map).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import orjson

from tito.config import ServerConfig
from tito.parse.base import stable_call_ids
from tito.render.base import TemplateRenderer
from tito.render.compare import mismatch_report
from tito.samples import assemble, encode_samples
from tito.samples.sample import Sample
from tito.samples.tree import LeafPath, Picker, Postprocessor, assemble_leaves, run_hooks
from tito.server.journal import Journal
from tito.server.metrics import Metrics
from tito.session import LinearSession, Session, TreeSession
from tito.session.matchers import resolve_matcher
from tito.session.store import SessionStore
from tito.session.tree import MAX_NODES, Node, leaves_of, path_messages, path_of
from tito.session.turns import TurnCommit, TurnPlan, replay_start
from tito.types.engine import (
    CheckedOutput,
    Engine,
    GenerateResult,
    PauseMode,
    ReplayRequest,
    SamplingParams,
    StreamChunk,
    check_output,
    stream_generate,
)
from tito.types.errors import BadRequest, ConfigError, EngineError, Misdirected, TitoError
from tito.types.hooks import load_function
from tito.types.messages import Message, ParsedCompletion, TurnRequest
from tito.types.placement import worker_of
from tito.types.records import TurnRecord, snapshot_ids
from tito.types.replay import decode_rows

log = logging.getLogger("tito.server")
PROBE_EVERY_S = 1.0
WORKERS = min(4, os.cpu_count() or 1)
"""Threads for CPU work of big requests (rendering, validation, parsing, samples)."""
DEFAULT_PICKER = "tito.samples.tree:drop_retries"
DEFAULT_POSTPROCESSOR = "tito.samples.tree:train_once"
PARSE_INLINE_MAX = 4096
"""Completions longer than this many ids are parsed in the worker pool."""
T = TypeVar("T")


@dataclass(slots=True)
class _Turn:
    """A planned turn about to meet the engine."""

    plan: TurnPlan
    params: SamplingParams
    replay: ReplayRequest | None
    rid: str
    started: float
    """``perf_counter()`` when the turn started (for ``/metrics``)."""
    engine_started: float
    """... and when it went to the engine (after any wait while paused)."""
    held: float
    """Seconds it waited while the engine was paused."""


@dataclass(slots=True)
class TurnOutcome:
    parsed: ParsedCompletion
    result: GenerateResult
    record: TurnRecord | None
    prompt_tokens: int
    response_id: str | None = None


class Gateway:
    def __init__(self, config: ServerConfig, renderer: TemplateRenderer, engine: Engine,
                 *, self_check: dict[str, Any] | None = None) -> None:
        self.config = config
        self.renderer = renderer
        self.engine = engine
        self.matcher = resolve_matcher(config.message_matcher)
        self.hook_names = (config.sample_picker or DEFAULT_PICKER,
                           config.sample_postprocessor or DEFAULT_POSTPROCESSOR)
        self.picker: Picker = load_function(self.hook_names[0], "--sample-picker")
        self.postprocessor: Postprocessor = load_function(self.hook_names[1],
                                                          "--sample-postprocessor")
        self.store = SessionStore(self._new_session, max_sessions=config.max_sessions,
                                  idle_ttl=config.session_ttl,
                                  worker=config.worker_index if config.workers > 1 else None)
        self.metrics = Metrics()
        self.instance_id = uuid.uuid4().hex
        self.self_check = self_check or {"ran": False}
        self.model_name = config.served_model_name or f"tito-{renderer.family}"
        self.started_at = time.time()
        self.vocab_size = renderer.tokenizer.vocab_size
        renderer.tokenizer.start_fast_encoder()  # tokenizing appended messages: the hot path
        self._background: set[asyncio.Task[None]] = set()
        self.workers = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="tito-cpu")
        self._probed_at = -PROBE_EVERY_S
        self._engine_error: str | None = None
        self.routing_layers, self.routing_top_k = routing_shape(config)
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self.pause_mode: PauseMode | None = None
        """The mode of the pause in force (None: not paused)."""
        self.journal: Journal | None = None
        if config.journal is not None:  # one journal folder per worker
            self.journal = Journal(config.journal if config.workers == 1 else
                                   os.path.join(config.journal,
                                                f"worker-{config.worker_index}"))
            state = self.journal.load(self._new_session,
                                      max_gone=self.store.max_tombstones)
            self.store.restore(state.live, state.gone)
            self.store.on_forget = self.journal.deleted

    def _new_session(self, session_id: str) -> Session:
        if self.config.session_version == "v2":
            return TreeSession(session_id, self.renderer, self.matcher,
                               max_nodes=self.config.max_nodes or MAX_NODES)
        max_rollback = 1 if self.config.max_rollback is None else self.config.max_rollback
        return LinearSession(session_id, self.renderer, self.matcher,
                             max_rollback=max_rollback)

    async def create_session(self) -> Session:
        session = self.store.create()
        if self.journal is not None:
            try:
                await self.journal.created(session)
            except BaseException:
                self.store.discard(session.session_id)
                raise
        self.metrics.inc("sessions_created_total")
        return session

    async def delete_session(self, session_id: str) -> None:
        self.session(session_id)  # another worker's session: 421 naming it
        durable = self.store.delete(session_id)
        if durable is not None:
            await durable

    def session(self, session_id: str) -> Session:
        """The live session ``session_id`` (NotFound otherwise; Misdirected when it is a
        session of another worker)."""
        workers = self.config.workers
        if workers > 1:
            owner = worker_of(session_id)
            if owner is not None and owner != self.config.worker_index and owner < workers:
                port = self.config.port - self.config.worker_index + owner
                raise Misdirected(f"session {session_id} belongs to worker {owner} of "
                                  f"{workers} (port {port}); send its requests there")
        return self.store.get(session_id)

    # -- turns ---------------------------------------------------------------------------
    async def _sampling(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        """Clamp ``max_new_tokens`` to ``--max-seq-len`` and the engine's context length."""
        context = await self.engine.context_length()
        # SGLang requires prompt + max_new_tokens < context length (strictly).
        limits = [(self.config.max_seq_len, "--max-seq-len", 0),
                  (context, "the engine's context length", 1)]
        allowed = params.max_new_tokens
        for limit, name, margin in limits:
            if limit is None:
                continue
            room = limit - margin - prompt_len
            if room < 1:
                raise BadRequest(
                    f"the prompt has {prompt_len} tokens, which leaves no room for a "
                    f"completion under {name} ({limit})",
                    code="context_length_exceeded",
                )
            allowed = min(allowed, room)
        # dataclasses.replace costs microseconds: only when the clamp changes something
        return params if allowed == params.max_new_tokens else \
            replace(params, max_new_tokens=allowed)

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the CPU worker pool, so the event loop keeps serving."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.workers, functools.partial(fn, *args))

    async def _plan(self, session: Session, request: TurnRequest) -> TurnPlan:
        """Plan a heavy turn in the worker pool (a light one plans on the loop)."""
        session.begin()  # claimed on the loop: no second turn can start meanwhile
        try:
            return await self.offload(session.prepare, request)
        except BaseException:
            session.release()
            raise

    async def run_turn(self, session: Session, request: TurnRequest,
                       params: SamplingParams, *, heavy: bool = False,
                       response_id: str | None = None) -> TurnOutcome:
        """One turn; ``heavy``: render the prompt (and parse the reply) off the event loop.
        ``response_id``: the API response's id (v2 nodes keep it: the join key between
        an agent's branch and its leaf)."""
        turn = await self._start_turn(session, request, params, heavy, response_id)
        try:
            try:
                turn.engine_started = time.perf_counter()
                result = await self.engine.generate(turn.plan.prompt_ids, turn.params,
                                                    turn.rid, replay=turn.replay)
            except asyncio.CancelledError:  # the client went away: stop the engine too
                self._abort_later(turn.rid)
                raise
            return await self._finish_turn(session, turn, result, heavy)
        except BaseException:
            session.release(turn.plan)
            raise

    async def run_turn_stream(self, session: Session, request: TurnRequest,
                              params: SamplingParams, *, heavy: bool = False,
                              response_id: str | None = None
                              ) -> AsyncGenerator[StreamChunk | TurnOutcome, None]:
        """One turn, streamed: :class:`StreamChunk` s (the output ids so far) as the engine
        generates, then the :class:`TurnOutcome` once the turn is **committed** (so a
        client that reads the terminal event and sends its next turn at once extends the
        committed state). Closing the iterator early (a client that left) aborts the
        engine request and leaves the session as it was. The record is the one
        :meth:`run_turn` would store."""
        turn = await self._start_turn(session, request, params, heavy, response_id)
        finished = False
        try:
            result: GenerateResult | None = None
            turn.engine_started = time.perf_counter()
            async with contextlib.aclosing(stream_generate(  # closed early: the request
                    self.engine, turn.plan.prompt_ids, turn.params, turn.rid,  # ends now
                    replay=turn.replay)) as chunks:
                async for chunk in chunks:
                    if chunk.result is not None:
                        result = chunk.result
                        break
                    yield chunk
            finished = True
            if result is None:
                raise EngineError(f"the engine stream of {turn.rid} ended without a result",
                                  code="engine_protocol_error")
            outcome = await self._finish_turn(session, turn, result, heavy)
        except BaseException:
            if not finished:
                self._abort_later(turn.rid)
            session.release(turn.plan)
            raise
        yield outcome

    async def _start_turn(self, session: Session, request: TurnRequest,
                          params: SamplingParams, heavy: bool,
                          response_id: str | None) -> _Turn:
        """Plan the turn (the session is claimed until it is committed or released) and
        settle its engine request; while the engine is paused, wait (held, not failed)."""
        started = time.perf_counter()
        held = 0.0
        plan = await self._plan(session, request) if heavy else session.plan(request)
        plan.response_id = response_id
        try:
            if self.config.max_prompt_tokens is not None and \
                    len(plan.prompt_ids) > self.config.max_prompt_tokens:
                raise BadRequest(f"the prompt has {len(plan.prompt_ids)} tokens, over "
                                 f"--max-prompt-tokens {self.config.max_prompt_tokens}",
                                 code="prompt_too_long")
            rid = f"{session.session_id}_t{len(session.records):06d}_{os.urandom(4).hex()}"
            params = await self._sampling(params, len(plan.prompt_ids))
            replay = self._replay(plan)
            if not self._unpaused.is_set():
                self.metrics.inc("turns_held_total")
                waited = time.perf_counter()
                await self._unpaused.wait()
                held = time.perf_counter() - waited
        except BaseException:
            session.release(plan)
            raise
        return _Turn(plan, params, replay, rid, started, started, held)

    async def _finish_turn(self, session: Session, turn: _Turn, result: GenerateResult,
                           heavy: bool) -> TurnOutcome:
        """Check the engine's output, parse it and commit the turn (the caller releases
        the plan if this raises)."""
        plan, replay = turn.plan, turn.replay
        engine_done = time.perf_counter()
        output = check_output(result, self.vocab_size)
        routed, indexer = self._replay_rows(replay, result, plan, output)
        if heavy or len(output.ids) > PARSE_INLINE_MAX:
            parsed = await self.offload(self.renderer.parse, result.output_ids,
                                        result.finish_reason)
        else:
            parsed = self.renderer.parse(result.output_ids, result.finish_reason)
        if plan.response_id is not None:
            stable_call_ids(parsed, plan.response_id)
        record = None
        if session.closed:
            session.release(plan)  # deleted while the engine ran: reply, store nothing
        else:
            commit = session.prepare_commit(
                plan, result, output, parsed.to_message(), routed=routed,
                routed_start=0 if replay is None else replay.start_len, indexer=indexer)
            if self.journal is None:
                session.apply(commit, plan)
            else:
                await self._store_turn(session, commit, plan)
            record = commit.record
        self._count_turn(turn, result, engine_done)
        return TurnOutcome(parsed, result, record, len(plan.prompt_ids), plan.response_id)

    def _count_turn(self, turn: _Turn, result: GenerateResult, engine_done: float) -> None:
        metrics, plan = self.metrics, turn.plan
        now = time.perf_counter()
        engine = engine_done - turn.engine_started
        metrics.inc("turns_total")
        metrics.inc("generated_tokens_total", len(result.output_ids))
        metrics.inc("bridge_tokens_total", len(plan.bridge_ids))
        if plan.rolled_back:
            metrics.inc("rollbacks_total")
        metrics.turn(latency=now - turn.started - turn.held, engine=engine,
                     overhead=now - turn.started - turn.held - engine,
                     prompt=len(plan.prompt_ids), bridge=len(plan.bridge_ids),
                     generated=len(result.output_ids), cached=result.cached_tokens or 0)

    def _replay(self, plan: TurnPlan) -> ReplayRequest | None:
        """What the engine must return for routing/indexer replay (None: replay is off)."""
        if not self.config.replay:
            return None
        start = replay_start(plan) if self.config.incremental_routing else 0
        return ReplayRequest(routed_experts=self.config.routing_replay,
                             indexer_topk=self.config.indexer_replay, start_len=start)

    def _replay_rows(self, replay: ReplayRequest | None, result: GenerateResult,
                     plan: TurnPlan, output: CheckedOutput
                     ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The turn's routing and indexer rows (int32 views of the engine's bytes)."""
        if replay is None:
            return None, None
        rows = max(len(plan.prompt_ids) + len(output.ids) - 1 - replay.start_len, 0)
        routed = None if not replay.routed_experts else decode_rows(
            result.routed_experts, rows=rows, layers=self.routing_layers or 1,
            top_k=self.routing_top_k, field="routed_experts")
        indexer = None
        if replay.indexer_topk and result.indexer_topk is not None:
            layers = result.indexer_topk_num_layers
            if layers is None or layers < 1:
                raise EngineError("meta_info.indexer_topk came without a positive "
                                  "indexer_topk_num_layers", code="engine_protocol_error")
            indexer = decode_rows(result.indexer_topk, rows=rows, layers=layers, top_k=None,
                                  field="indexer_topk")
        return routed, indexer

    def stored_sizes(self) -> dict[str, float]:
        """What the live sessions hold: token ids (of their active paths), and the bytes of
        their stored ids (a v1 session of a family without trailing trim keeps them once,
        in its snapshot), logprobs and routing rows (gauges of ``/metrics``). Walks every
        live record: run it in the worker pool."""
        tokens = stored = routing = 0
        for session in self.store.values():
            tokens += session.num_tokens
            if isinstance(session, TreeSession):
                records = [n.record for n in session.nodes]
                stored += sum(rec.bridge_ids.nbytes + rec.output_ids.nbytes
                              for rec in records)
            else:
                records = session.records
                stored += session.ids_nbytes
            for rec in records:
                stored += rec.logprobs.nbytes
                for rows in (rec.routed_experts, rec.indexer_topk):
                    if rows is not None:
                        routing += rows.nbytes
        return {"stored_tokens": tokens, "stored_bytes": stored + routing,
                "stored_routing_bytes": routing}

    # -- engine control (forwarded) --------------------------------------------------------
    async def pause(self, mode: PauseMode | None = None) -> PauseMode:
        """Pause the engine (default: ``--pause-generation-mode``); turns that arrive
        meanwhile are held until :meth:`resume`, not failed."""
        mode = mode or self.config.pause_generation_mode  # type: ignore[assignment]
        assert mode is not None
        self._unpaused.clear()
        try:
            await self.engine.pause(mode)
        except BaseException:
            if self.pause_mode is None:
                self._unpaused.set()
            raise
        self.pause_mode = mode
        self.metrics.inc("engine_pauses_total")
        return mode

    async def resume(self) -> None:
        await self.engine.resume()
        self.pause_mode = None
        self._unpaused.set()

    async def update_weight_version(self, version: str) -> None:
        await self.engine.update_weight_version(version)

    async def _store_turn(self, session: Session, turn: TurnCommit,
                          plan: TurnPlan) -> None:
        """Apply a prepared turn once the journal has it (without a journal the caller
        applies it at once). Not interrupted by a cancellation (a client that leaves now):
        the turn is finished, then it propagates."""
        journal = self.journal
        assert journal is not None

        async def store() -> None:
            await journal.turn(session.session_id, turn)
            session.apply(turn, plan)

        task = asyncio.ensure_future(store())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await task
            raise

    async def engine_state(self, *, refresh: bool = False) -> str | None:
        """None when the engine is up, else why not (probed at most once a second)."""
        now = time.monotonic()
        if refresh or now - self._probed_at >= PROBE_EVERY_S:
            try:
                self._engine_error = await asyncio.wait_for(self.engine.probe(), 5.0)
            except Exception as exc:  # a probe that itself fails says the engine is down
                self._engine_error = f"{type(exc).__name__}: {exc}"
            self._probed_at = time.monotonic()
        return self._engine_error

    def _abort_later(self, rid: str) -> None:
        """Abort ``rid`` on the engine without waiting (we are being cancelled)."""

        async def abort() -> None:
            try:
                await self.engine.abort(rid)
            except Exception:
                log.warning("aborting %s on the engine failed", rid, exc_info=True)

        task = asyncio.create_task(abort())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        self.metrics.inc("engine_aborts_total")

    # -- samples -------------------------------------------------------------------------
    async def samples_payload(self, session: Session, max_seq_len: int | None,
                              metadata: dict[str, Any] | None, *,
                              include_response: bool = True) -> bytes:
        """Assemble and encode the session's samples in the worker pool, from what is
        committed: a turn still running (or one sent meanwhile) is not in them, and the
        session metadata says ``turn_in_progress: true`` (a collector that gave up on its
        agent still gets the trajectory so far). The collection reads copies taken here
        (committed records never change), so turns go on meanwhile."""
        limit = max_seq_len if max_seq_len is not None else self.config.max_seq_len
        running = session.in_flight
        if isinstance(session, TreeSession):
            return await self.offload(self._tree_samples_payload, session,
                                      session.nodes[:], limit, metadata or {},
                                      include_response, running)
        view = _LinearView(session.records[:], session.messages[:],
                           session.snapshot.view().copy(), session.tools)
        return await self.offload(self._samples_payload, session, view, limit, metadata,
                                  include_response, running)

    def _samples_payload(self, session: LinearSession, view: _LinearView, limit: int | None,
                         metadata: dict[str, Any] | None, include_response: bool,
                         running: bool) -> bytes:
        session_meta = self.path_metadata(session, view.records, view.messages, view.ids,
                                          view.tools)
        sample_meta = {**(metadata or {}), **session_meta}
        session_meta["turn_in_progress"] = running  # the payload's, not each sample's
        result = assemble(
            view.records,
            decode=self.renderer.tokenizer.decode,
            max_seq_len=limit,
            metadata=sample_meta,
            include_response=include_response,
            routing=self.config.routing_replay,
            indexer=self.config.indexer_replay,
        )
        self._count_samples(result.samples)
        return encode_samples(result.samples, session_metadata=session_meta,
                              empty_reason=result.empty_reason)

    def _tree_samples_payload(self, session: TreeSession, nodes: list[Node],
                              limit: int | None, agent: dict[str, Any],
                              include_response: bool, running: bool) -> bytes:
        """One sample per leaf (as v1 assembles a path), then the picker and the
        postprocessor (design §6)."""
        session_meta = self.session_metadata(session, nodes)
        session_meta["turn_in_progress"] = running
        leaves = [LeafPath([n.id for n in path], [n.record for n in path], leaf.parent,
                           leaf.response_id)
                  for leaf in leaves_of(nodes) for path in [path_of(nodes, leaf.id)]]

        def metadata_of(leaf: LeafPath) -> dict[str, Any]:
            path = [nodes[i] for i in leaf.path_node_ids]
            return {**agent, **self.trajectory_metadata(session, path)}

        samples: list[Sample] = assemble_leaves(
            leaves, decode=self.renderer.tokenizer.decode, max_seq_len=limit,
            metadata_of=metadata_of, include_response=include_response,
            routing=self.config.routing_replay, indexer=self.config.indexer_replay)
        self.metrics.inc("leaf_samples_total", len(samples))
        if samples:
            samples = run_hooks(samples, picker=self.picker, postprocessor=self.postprocessor,
                                names=self.hook_names, session_metadata=session_meta,
                                agent_metadata=agent)
        empty = None if samples else ("no_records" if not nodes else "all_truncated")
        self._count_samples(samples)
        return encode_samples(samples, session_metadata=session_meta, empty_reason=empty)

    def _count_samples(self, samples: list[Sample]) -> None:
        """``samples_total`` and the mismatch classes of the samples collected."""
        self.metrics.inc("samples_total", len(samples))
        for sample in samples:
            report = sample.metadata.get("tito_session_mismatch")
            if isinstance(report, list) and report:
                self.metrics.mismatch([str(item.get("type")) for item in report
                                       if isinstance(item, dict)])

    def session_metadata(self, session: Session, nodes: list[Node] | None = None
                         ) -> dict[str, Any]:
        """The session's metadata: that of its (active) path; a v2 tree adds ``tree``."""
        if isinstance(session, LinearSession):
            return self.path_metadata(session, session.records, session.messages,
                                      session.snapshot.view(), session.tools)
        nodes = session.nodes[:] if nodes is None else nodes
        leaf = session.active_leaf if session.active_leaf is not None and \
            session.active_leaf < len(nodes) else (len(nodes) - 1 if nodes else None)
        path = [] if leaf is None else path_of(nodes, leaf)
        meta = self.trajectory_metadata(session, path)
        meta["tree"] = tree_view(nodes, leaf)
        return meta

    def trajectory_metadata(self, session: Session, path: list[Node]) -> dict[str, Any]:
        """The metadata of one root→node path of a tree (what v1 reports for its path)."""
        records = [n.record for n in path]
        tools = next((n.tools for n in reversed(path) if n.tools is not None), None)
        return self.path_metadata(session, records, path_messages(path),
                                  snapshot_ids(records), tools)

    def path_metadata(self, session: Session, records: list[TurnRecord],
                      messages: list[Message], ids: np.ndarray,
                      tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        """The metadata of one path (records, its messages, its ids), mismatch report
        included: what a sample of it carries."""
        meta: dict[str, Any] = {
            "session_id": session.session_id,
            "session_version": session.version,
            "family": self.renderer.family,
            "num_turns": len(records),
            "num_messages": len(messages),
            "num_tokens": len(ids),
            "max_trailing_trim": self.renderer.max_trailing_trim,
            "max_trim_tokens": self.renderer.max_trailing_trim,
            "instance_id": self.instance_id,
        }
        kwargs = records[-1].request.get("chat_template_kwargs") if records else None
        try:
            meta["tito_session_mismatch"] = mismatch_report(
                self.renderer, messages, np.asarray(ids), tools=tools, template_kwargs=kwargs)
        except TitoError as exc:
            meta["tito_session_mismatch_error"] = exc.message
        return meta


@dataclass(frozen=True, slots=True)
class _LinearView:
    """What a v1 collection reads: copies taken on the event loop."""

    records: list[TurnRecord]
    messages: list[Message]
    ids: np.ndarray
    tools: list[dict[str, Any]] | None


def routing_shape(config: ServerConfig) -> tuple[int | None, int | None]:
    """(layers, top_k) of routing rows: ``--routing-layers``, else ``num_hidden_layers`` of
    the model's ``config.json`` in the tokenizer folder; top_k from its
    ``num_experts_per_tok`` when present (None: inferred from each payload)."""
    if not config.routing_replay:
        return None, None
    model: dict[str, Any] = {}
    path = os.path.join(config.tokenizer or "", "config.json")
    if config.tokenizer and os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                loaded = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        model = loaded.get("text_config", loaded) if isinstance(loaded, dict) else {}
    layers = config.routing_layers or model.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        raise ConfigError("--routing-replay needs the number of layers per routing row: pass "
                          "--routing-layers N, or put the model's config.json (with "
                          "num_hidden_layers) in the --tokenizer folder")
    top_k = model.get("num_experts_per_tok")
    return layers, top_k if isinstance(top_k, int) and top_k > 0 else None


def tree_view(nodes: list[Node], active_leaf: int | None) -> dict[str, Any]:
    """``metadata.tree``: every node and every leaf with its path (design §5.2)."""
    return {
        "active_leaf": active_leaf,
        "nodes": [{"id": n.id, "parent": n.parent, "depth": n.depth,
                   "truncated": n.truncated, "completion_span": list(n.completion_span),
                   "num_tokens": n.record.checkpoint_len, "finish_reason":
                   n.record.finish_reason, "committed_at": n.record.commit_ts,
                   "response_id": n.response_id}
                  for n in nodes],
        "leaves": [{"node_id": leaf.id, "path_node_ids": [p.id for p in path_of(nodes, leaf.id)]}
                   for leaf in leaves_of(nodes)],
    }
