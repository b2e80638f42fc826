"""Continuous batching for the embedded engine: one worker thread, one running batch.

The worker loops: admit waiting requests (up to ``max_batch_size``), build one ragged step
(one token for every decoding request, then prefill chunks of newly admitted ones within a
``max_step_tokens`` budget), run the model, sample, and retire finished or aborted requests.
A request therefore joins or leaves the batch between any two decode steps, and each has
its own KV cache (see :mod:`tito.engines.embedded_model`).

Model compute runs only on this thread: torch releases the GIL inside its kernels, so the
asyncio event loop (the gateway's HTTP server) keeps answering while a batch decodes.
Results go back to each request's own event loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from tito.engines.embedded_model import KVCache, LlamaModel, Segment
from tito.engines.embedded_prefix import PrefixStore
from tito.engines.embedded_sampling import SamplerState, sample
from tito.types.engine import FinishReason, GenerateResult, PauseMode, SamplingParams
from tito.types.errors import EngineError, EngineRejected

Deliver = Callable[[GenerateResult | BaseException], None]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SchedulerConfig:
    """Batching knobs (defaults measured on a 2-core CPU, see docs/performance.md)."""

    max_batch_size: int = 16
    max_step_tokens: int = 256
    prefix_cache_bytes: int = 1 << 30
    num_threads: int | None = None  # None: default_threads()
    weight_version: str = "default"


@dataclass(eq=False, slots=True)
class Request:
    """One generation in flight. ``ids`` is prompt + output; the KV cache holds a prefix."""

    rid: str
    prompt: list[int]
    params: SamplingParams
    sampler: SamplerState
    stop_ids: frozenset[int]
    deliver: Deliver
    progress: Callable[[int], None] | None = None
    """Called (in the scheduler thread) with each output id but the last (streaming)."""
    arrived: float = field(default_factory=time.perf_counter)
    ids: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cache: KVCache | None = None
    cached_tokens: int = 0
    retractions: int = 0
    aborted: bool = False
    done: bool = False

    def __post_init__(self) -> None:
        self.ids = list(self.prompt)


@dataclass(slots=True)
class SchedulerStats:
    steps: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    finished: int = 0
    max_running: int = 0


def default_threads() -> int:
    """torch threads for the worker: ``$OMP_NUM_THREADS`` if set, else all cores but one
    (at least 1). On a 2-core box that is 1: a second thread is ~1.3x faster on an idle
    machine but ~1.9x slower as soon as one other process (the gateway, the agents, the
    event loop) wants a core, because OpenMP barriers wait for the descheduled thread."""
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 2
    return max(1, cores - 1)


class BatchScheduler:
    """Owns the worker thread, the waiting queue and the running batch."""

    def __init__(
        self,
        model: LlamaModel,
        decode: Callable[[Sequence[int]], str],
        config: SchedulerConfig | None = None,
    ):
        self.model = model
        self.config = config or SchedulerConfig()
        self._decode = decode
        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._inflight: dict[str, Request] = {}
        self._paused = False
        self._retract_pending = False
        self._busy = False
        self._closed = False
        self.prefix = PrefixStore(self.config.prefix_cache_bytes)
        self.stats = SchedulerStats()
        self._thread = threading.Thread(target=self._run, name="tito-embedded", daemon=True)
        self._thread.start()

    # ---- called from other threads -------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    def submit(self, req: Request) -> None:
        with self._cond:
            if self._closed:
                raise EngineError("embedded engine is closed")
            if req.rid in self._inflight:
                raise EngineRejected(f"duplicate request id {req.rid!r}")
            self._inflight[req.rid] = req
            self._waiting.append(req)
            self._cond.notify_all()

    def abort(self, rid: str) -> bool:
        """Abort ``rid``: at once if waiting, before the next step if running."""
        with self._cond:
            req = self._inflight.get(rid)
            if req is None:
                return False
            self._abort_locked(req)
            return True

    def abort_request(self, req: Request) -> None:
        with self._cond:
            if not req.done:
                self._abort_locked(req)

    def pause(self, mode: PauseMode) -> None:
        """Stop stepping; returns once the worker is idle (blocking: call in a thread)."""
        with self._cond:
            self._paused = True
            if mode == "abort":
                for req in list(self._inflight.values()):
                    self._abort_locked(req)
            elif mode == "retract":
                self._retract_pending = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._busy or self._closed)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._retract_pending = False
            self._cond.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        with self._cond:
            pending = list(self._inflight.values())
            self._inflight.clear()
            self._waiting.clear()
            self._running.clear()
        for req in pending:
            req.done = True
            req.deliver(EngineError("embedded engine closed while the request was running"))
        self.prefix.clear()

    def snapshot(self) -> dict[str, int]:
        with self._cond:
            return {
                "running": len(self._running),
                "waiting": len(self._waiting),
                "paused": int(self._paused),
                "prefix_entries": len(self.prefix),
                "prefix_bytes": self.prefix.nbytes,
                "prefix_hits": self.prefix.hits,
                **{k: getattr(self.stats, k) for k in self.stats.__dataclass_fields__},
            }

    def _abort_locked(self, req: Request) -> None:
        req.aborted = True
        if req in self._waiting:
            self._waiting.remove(req)
            self._finish_locked(req, "abort", None)
        self._cond.notify_all()

    # ---- worker thread -------------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(self.config.num_threads or default_threads())
        with torch.inference_mode():
            while (batch := self._next_batch()) is not None:
                self._run_batch(*batch)

    def _next_batch(self) -> tuple[list[Request], list[Request]] | None:
        """Wait for work; admit waiting requests. (admitted, running), or None once closed."""
        with self._cond:
            while True:
                for req in [r for r in self._running if r.aborted]:
                    self._running.remove(req)
                    self._finish_locked(req, "abort", None)
                if self._paused and self._retract_pending:
                    self._retract_locked()
                if self._closed:
                    return None
                if not self._paused and (self._waiting or self._running):
                    break
                self._busy = False
                self._cond.notify_all()
                self._cond.wait()
            self._busy = True
            admitted = []
            while self._waiting and len(self._running) < self.config.max_batch_size:
                req = self._waiting.popleft()
                self._running.append(req)
                admitted.append(req)
            self.stats.max_running = max(self.stats.max_running, len(self._running))
            return admitted, list(self._running)

    def _run_batch(self, admitted: list[Request], running: list[Request]) -> None:
        """One step; a failure (a bug, OOM) fails the batch and the engine keeps serving."""
        try:
            for req in admitted:
                self._prepare(req)
            self._step(running)
        except Exception as exc:
            log.exception("embedded engine step failed; failing the %d request(s) of the "
                          "batch: %s", len(running), ", ".join(r.rid for r in running))
            with self._cond:
                for req in running:
                    if req in self._running:
                        self._running.remove(req)
                    error = EngineError(f"embedded engine step failed: {exc}")
                    error.__cause__ = exc  # delivered, not raised: chain it by hand
                    self._finish_locked(req, exc=error)

    def _retract_locked(self) -> None:
        """``pause(retract)``: running requests go back to the queue front without KV;
        they are re-prefilled (prompt + output so far) after ``resume``."""
        self._retract_pending = False
        for req in reversed(self._running):
            req.cache = None
            req.retractions += 1
            self._waiting.appendleft(req)
        self._running.clear()

    def _prepare(self, req: Request) -> None:
        """Attach a KV cache, reusing the longest cached prefix of the sequence."""
        if req.cache is not None:
            return
        ctx = self.model.cfg.max_position_embeddings
        capacity = min(ctx, len(req.ids) + min(req.params.max_new_tokens, 512))
        entry, n = self.prefix.match(req.ids)
        if entry is not None:
            req.cache = entry.cache.clone_prefix(self.model.cfg, n, capacity)
        else:
            req.cache = self.model.new_cache(capacity)
        if req.retractions == 0:
            req.cached_tokens = n
            self.stats.cached_tokens += n

    def _step(self, running: list[Request]) -> None:
        segments: list[Segment] = []
        owners: list[Request] = []
        for req in running:  # decodes first: they cost one token each
            assert req.cache is not None
            if len(req.ids) - req.cache.length == 1:
                segments.append(Segment(req.cache, req.ids[-1:]))
                owners.append(req)
        budget = max(self.config.max_step_tokens - len(segments), 32)
        for req in running:  # then prefill chunks, oldest first
            assert req.cache is not None
            start = req.cache.length
            pending = len(req.ids) - start
            if pending > 1 and budget > 0:
                n = min(pending, budget)
                budget -= n
                segments.append(Segment(req.cache, req.ids[start : start + n], n == pending))
                owners.append(req)
                self.stats.prefill_tokens += n
        logits = self.model.forward(segments)
        self.stats.steps += 1
        sampling = [req for seg, req in zip(segments, owners, strict=True) if seg.want_logits]
        self._advance(sampling, sample(logits, [req.sampler for req in sampling]))

    def _advance(self, sampling: list[Request], results: Sequence[tuple[int, float]]) -> None:
        """Append each sampled id; finish the requests it ends."""
        done: list[tuple[Request, FinishReason, int | str | None]] = []
        for req, (tok, logprob) in zip(sampling, results, strict=True):
            req.output.append(tok)
            req.logprobs.append(logprob)
            req.ids.append(tok)
            self.stats.generated_tokens += 1
            finish = self._check_finished(req, tok)
            if finish is not None:
                done.append((req, *finish))
            elif req.progress is not None:
                req.progress(tok)
        if done:
            with self._cond:
                for req, reason, matched in done:
                    if req in self._running:
                        self._running.remove(req)
                    self._finish_locked(req, reason, matched)

    def _check_finished(
        self, req: Request, tok: int
    ) -> tuple[FinishReason, int | str | None] | None:
        p = req.params
        if tok in req.stop_ids:
            return "stop", tok
        if p.stop:
            matched = self._match_stop_string(req)
            if matched is not None:
                return "stop", matched
        if len(req.output) >= p.max_new_tokens:
            return "length", None
        if len(req.ids) >= self.model.cfg.max_position_embeddings:
            return "length", None
        return None

    def _match_stop_string(self, req: Request) -> str | None:
        """A stop string completed by the newest token (decoded over a short tail)."""
        longest = max(len(s) for s in req.params.stop)
        tail = self._decode(req.output[-(4 * longest + 2) :])
        for s in req.params.stop:
            if s and s in tail:
                return s
        return None

    def _finish_locked(
        self,
        req: Request,
        reason: FinishReason = "abort",
        matched: int | str | None = None,
        *,
        exc: BaseException | None = None,
    ) -> None:
        if req.done:
            return
        req.done = True
        self._inflight.pop(req.rid, None)
        cache, req.cache = req.cache, None
        if exc is not None:
            req.deliver(exc)
            return
        if cache is not None and cache.length > 0 and threading.current_thread() is self._thread:
            self.prefix.put(req.ids[: cache.length], cache)
        self.stats.finished += 1
        extra: dict[str, object] = {}
        if req.retractions:
            extra["num_retractions"] = req.retractions
        if reason == "abort":
            extra["message"] = "Aborted"
        req.deliver(
            GenerateResult(
                output_ids=list(req.output),
                logprobs=list(req.logprobs),
                finish_reason=reason,
                matched_stop=matched,
                prompt_tokens=len(req.prompt),
                cached_tokens=req.cached_tokens,
                weight_version=self.config.weight_version,
                e2e_latency=time.perf_counter() - req.arrived,
                extra=extra,
            )
        )
