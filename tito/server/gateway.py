"""The gateway's turn service: sessions + renderer + engine, independent of any API's shape.

Each API (:mod:`tito.server.adapter`) converts its request into a
:class:`tito.types.messages.TurnRequest`, calls :meth:`Gateway.run_turn` (or
:meth:`Gateway.run_turn_stream`), and renders the :class:`TurnOutcome` in its own response
shape (design §3.2: the code map). Engine control lives in
:mod:`tito.server.engine_control`, routing replay in :mod:`tito.server.routing_replay`,
samples and the stored-bytes gauges in :mod:`tito.server.samples`.
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

from tito.config import ServerConfig
from tito.parse.base import stable_call_ids
from tito.render.base import TemplateRenderer
from tito.server.api_state import ApiState
from tito.server.engine_control import EngineControl
from tito.server.journal import Journal, open_journal
from tito.server.metrics import Metrics
from tito.server.peers import Peers
from tito.server.routing_replay import RoutingReplay, check_truncated
from tito.server.session_options import SessionOptions
from tito.session import LinearSession, Session, TreeSession, TurnSession
from tito.session.collect import Hooks
from tito.session.contexts import ContextSession
from tito.session.matchers import resolve_matcher
from tito.session.metadata import Describer
from tito.session.store import SessionStore
from tito.session.tree import MAX_NODES
from tito.session.turns import TurnCommit, TurnPlan
from tito.types.engine import (
    Engine,
    GenerateResult,
    ReplayRequest,
    SamplingParams,
    StreamChunk,
    check_output,
    stream_generate,
)
from tito.types.errors import BadRequest, EngineError, Misdirected, WorkerUnavailable
from tito.types.hooks import load_function
from tito.types.messages import ParsedCompletion, TurnRequest
from tito.types.placement import worker_of
from tito.types.records import TurnRecord

log = logging.getLogger("tito.server")
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
        self.matcher = resolve_matcher(
            config.message_matcher,
            call_ids_rendered=config.message_matcher != "harness" or renderer.renders_call_ids())
        names = (config.sample_picker or DEFAULT_PICKER,
                 config.sample_postprocessor or DEFAULT_POSTPROCESSOR)
        self.hooks = Hooks(load_function(names[0], "--sample-picker"),
                           load_function(names[1], "--sample-postprocessor"), names)
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
        self.workers = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="tito-cpu")
        self.control = EngineControl(engine, config, self.metrics)
        self.routing = RoutingReplay(config)
        self.peers = Peers(config.host, config.port - config.worker_index, config.workers,
                           config.worker_index) if config.workers > 1 else None
        """The other workers of ``--workers N`` (checked by ``tito serve``)."""
        self.journal: Journal | None = None
        if config.journal is not None:  # one journal folder per worker
            self.journal = open_journal(config, renderer)
            state = self.journal.load(self._new_session,
                                      max_gone=self.store.max_tombstones)
            self.store.restore(state.live, state.gone)
            self.store.on_forget = self.journal.deleted

    @property
    def describer(self) -> Describer:
        """Who describes this gateway's sessions (its renderer and instance id)."""
        return Describer(self.renderer, self.instance_id)

    def _new_session(self, session_id: str) -> Session:
        """A session of agent contexts (design §5.5), each a v1 path or a v2 tree."""
        config, renderer, matcher = self.config, self.renderer, self.matcher
        # (no reference to the gateway: a deleted session is freed by its refcount)
        max_nodes = config.max_nodes or MAX_NODES
        max_rollback = 1 if config.max_rollback is None else config.max_rollback
        tree = config.session_version == "v2"

        after_cut = config.after_length_cut

        def new_context() -> TurnSession:
            if tree:
                return TreeSession(session_id, renderer, matcher, max_nodes=max_nodes,
                                   after_length_cut=after_cut)
            return LinearSession(session_id, renderer, matcher, max_rollback=max_rollback,
                                 after_length_cut=after_cut)

        return ContextSession(session_id, new_context, matcher=matcher,
                              side_requests=config.side_requests, api_state=ApiState())

    async def create_session(self, options: SessionOptions | None = None) -> Session:
        """A new session (with ``POST /sessions``'s ``options``), journaled before it is
        answered."""
        if self.journal is not None:
            self.journal.check_writable()  # 503 journal_unavailable once it failed
        session = self.store.create()
        if options is not None:
            ApiState.of(session).options = options
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
        if self.journal is not None:
            self.journal.check_writable()
        durable = self.store.delete(session_id)
        if durable is not None:
            await durable

    def session(self, session_id: str) -> Session:
        """The live session ``session_id`` (NotFound otherwise). A session of another
        worker: Misdirected (421) naming it, or WorkerUnavailable (503) while it is down."""
        peers = self.peers
        if peers is not None:
            owner = worker_of(session_id)
            if owner is not None and owner != peers.me and owner < peers.count:
                where = f"worker {owner} of {peers.count} (port {peers.port(owner)})"
                if peers.is_down(owner):
                    raise WorkerUnavailable(
                        f"session {session_id} belongs to {where}, which is down now "
                        f"({peers.down.get(owner)}); retry it there once it is back")
                raise Misdirected(f"session {session_id} belongs to {where}; send its "
                                  "requests there")
        return self.store.get(session_id)

    # -- turns ---------------------------------------------------------------------------
    async def _sampling(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        """Clamp ``max_new_tokens`` to ``--max-seq-len`` and the engine's context length."""
        if self.config.sampling_mask_replay:
            check_truncated(params)
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
        """Plan an offloaded turn in the worker pool (others plan on the loop)."""
        session.begin(request)  # claimed on the loop: no second turn can start meanwhile
        try:
            return await self.offload(session.prepare, request)
        except BaseException:
            session.release(request=request)
            raise

    async def run_turn(self, session: Session, request: TurnRequest,
                       params: SamplingParams, *, offload: bool = False,
                       response_id: str | None = None) -> TurnOutcome:
        """One turn; ``offload``: render the prompt (and parse the reply) off the event loop.
        ``response_id``: the API response's id (v2 nodes keep it: the join key between
        an agent's branch and its leaf)."""
        turn = await self._start_turn(session, request, params, offload, response_id)
        try:
            try:
                turn.engine_started = time.perf_counter()
                result = await self.engine.generate(turn.plan.prompt_ids, turn.params,
                                                    turn.rid, replay=turn.replay)
            except asyncio.CancelledError:  # the client went away: stop the engine too
                self.control.abort_later(turn.rid)
                raise
            return await self._finish_turn(session, turn, result, offload)
        except BaseException:
            session.release(turn.plan)
            raise

    async def run_turn_stream(self, session: Session, request: TurnRequest,
                              params: SamplingParams, *, offload: bool = False,
                              response_id: str | None = None
                              ) -> AsyncGenerator[StreamChunk | TurnOutcome, None]:
        """One turn, streamed: :class:`StreamChunk` s (the output ids so far) as the engine
        generates, then the :class:`TurnOutcome` once the turn is **committed** (so a
        client that reads the terminal event and sends its next turn at once extends the
        committed state). Closing the iterator early (a client that left) aborts the
        engine request and leaves the session as it was. The record is the one
        :meth:`run_turn` would store."""
        turn = await self._start_turn(session, request, params, offload, response_id)
        finished = False
        try:
            result: GenerateResult | None = None
            turn.engine_started = time.perf_counter()
            async with contextlib.aclosing(stream_generate(  # closed early: the request
                    self.engine, turn.plan.prompt_ids, turn.params, turn.rid,  # ends now
                    replay=turn.replay, vocab_size=self.vocab_size)) as chunks:
                async for chunk in chunks:
                    if chunk.result is not None:
                        result = chunk.result
                        break
                    yield chunk
            finished = True
            if result is None:
                raise EngineError(f"the engine stream of {turn.rid} ended without a result",
                                  code="engine_protocol_error")
            outcome = await self._finish_turn(session, turn, result, offload)
        except BaseException:
            if not finished:
                self.control.abort_later(turn.rid)
            session.release(turn.plan)
            raise
        yield outcome

    async def _start_turn(self, session: Session, request: TurnRequest,
                          params: SamplingParams, offload: bool,
                          response_id: str | None) -> _Turn:
        """Plan the turn (the session is claimed until it is committed or released) and
        settle its engine request; while the engine is paused, wait (held, not failed)."""
        started = time.perf_counter()
        if self.journal is not None:
            self.journal.check_writable()  # a turn it could not keep is not run
        plan = await self._plan(session, request) if offload else session.plan(request)
        plan.response_id = response_id
        try:
            if self.config.max_prompt_tokens is not None and \
                    len(plan.prompt_ids) > self.config.max_prompt_tokens:
                raise BadRequest(f"the prompt has {len(plan.prompt_ids)} tokens, over "
                                 f"--max-prompt-tokens {self.config.max_prompt_tokens}",
                                 code="prompt_too_long")
            rid = f"{session.session_id}_t{len(session.records):06d}_{os.urandom(4).hex()}"
            params = await self._sampling(params, len(plan.prompt_ids))
            replay = self.routing.request(plan)
            held = await self.control.wait_unpaused()
        except BaseException:
            session.release(plan)
            raise
        return _Turn(plan, params, replay, rid, started, started, held)

    async def _finish_turn(self, session: Session, turn: _Turn, result: GenerateResult,
                           offload: bool) -> TurnOutcome:
        """Check the engine's output, parse it and commit the turn (the caller releases
        the plan if this raises)."""
        plan, replay = turn.plan, turn.replay
        engine_done = time.perf_counter()
        output = check_output(result, self.vocab_size)
        routed, indexer = self.routing.rows(replay, result, plan, output)
        result.sampling_mask = self.routing.mask(replay, result, output)  # checked, or None
        if offload or len(output.ids) > PARSE_INLINE_MAX:
            parsed = await self.offload(self.renderer.parse_turn, result.output_ids,
                                        result.finish_reason, plan.request.template_kwargs)
        else:
            parsed = self.renderer.parse_turn(result.output_ids, result.finish_reason,
                                              plan.request.template_kwargs)
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
        if plan.divergence is not None:
            metrics.inc("discarded_turns_total", plan.divergence["discarded"])
            log_discarded(turn.rid, plan.divergence)
        if plan.tolerated:
            metrics.tolerate(plan.tolerated)
        metrics.agent_turns["main" if plan.context is None else plan.context.role] += 1
        metrics.turn(latency=now - turn.started - turn.held, engine=engine,
                     overhead=now - turn.started - turn.held - engine,
                     prompt=len(plan.prompt_ids), bridge=len(plan.bridge_ids),
                     generated=len(result.output_ids), cached=result.cached_tokens or 0)

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


def log_discarded(rid: str, divergence: dict[str, Any]) -> None:
    """One line per turn that discards generated turns: where the request left the path."""
    where = f"message {divergence['message']}"
    fields = divergence.get("fields")
    log.warning("%s discarded %d generated turn(s): the request left the stored path at %s "
                "(%s)", rid, divergence["discarded"], where,
                f"{', '.join(fields)} differ" if fields else "the request ends there: a retry")
