"""The life of a mock request: admission, generation token by token, abort, pause.

A request is planned in full when it starts (:meth:`MockModel.plan`) and then emitted
token by token at the configured latency; aborts (by rid prefix, by ``abort_all``, by a
pause in ``abort`` mode, by a client that goes away) and pauses take effect between
tokens, as in SGLang's scheduler. Finished requests are recorded in the request log
(``GET /mock/requests``) and their sequence is inserted into the radix cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tito.engines.mock.contract import (
    RequestError,
    check_body,
    check_lengths,
    check_routed_experts,
    check_sampling_mask,
    prompt_ids,
    request_id,
)
from tito.engines.mock.directives import MockModel, Plan
from tito.engines.mock.radix import RadixCache

ABORTED_MESSAGE = "Aborted"
WAITING_ABORT_MESSAGE = "Abort in waiting queue"
PAUSE_MODES = ("abort", "retract", "in_place")


def abort_reason(message: str = ABORTED_MESSAGE) -> dict[str, Any]:
    """SGLang's finish reason of an aborted request."""
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


@dataclass
class MockConfig:
    tokenizer_dir: str
    family: str = "qwen3"
    latency_ms: float = 0.0
    token_latency_ms: float = 0.0
    context_length: int = 32768
    weight_version: str = "default"
    served_model_name: str | None = None
    enable_return_routed_experts: bool = False
    num_layers: int = 4
    topk: int = 2
    num_experts: int = 16
    enable_return_indexer_topk: bool = False
    indexer_layers: int = 2
    indexer_topk: int = 4
    request_log_size: int = 1000
    keepalive_timeout: float = 5.0
    """Seconds an idle keep-alive connection is kept (uvicorn's ``timeout_keep_alive``,
    whose default SGLang's server keeps)."""
    faults: tuple[str, ...] = ()
    """``MODE[:ARG]`` faults given to every ``/generate`` request
    (:mod:`tito.engines.mock.faults`)."""
    speculative_num_draft_tokens: int = 0
    """SGLang's ``--speculative-num-draft-tokens`` (0: speculative decoding off). On, the
    final ``meta_info`` carries the counters SGLang reports (``spec_verify_ct``,
    ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``) of a deterministic
    acceptance pattern (:func:`tito.engines.mock.replies.spec_counters`)."""
    incremental_streaming_output: bool = False
    """SGLang's ``--incremental-streaming-output``: stream chunks carry the ids (and
    logprobs, text) since the previous chunk instead of everything so far."""


@dataclass
class ReqState:
    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]
    body: dict[str, Any]
    arrived: float
    log: dict[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: bool = False
    started: bool = False
    finished: bool = False
    emitted: int = 0
    num_retractions: int = 0
    cached_tokens: int = 0
    plan: Plan | None = None
    versions: list[tuple[str, int]] = field(default_factory=list)
    """(weight version, first output index) each time the version changed mid-request."""
    rows: list[list[Any]] = field(default_factory=list)
    """A stream's ``[logprob, id, text]`` entries built so far (each built once)."""
    text: str = ""
    """A stream's text decoded so far (ids ``[0, text_upto)``), extended per chunk."""
    text_upto: int = 0


class Lifecycle:
    """Requests in flight, the pause state, the weight version, the cache and the log."""

    def __init__(self, config: MockConfig, model: MockModel):
        self.config = config
        self.model = model
        self.tokenizer = model.tokenizer
        self.weight_version = config.weight_version
        self.in_flight: dict[str, ReqState] = {}
        self.paused = False
        self.pause_mode: str | None = None
        self.cache = RadixCache()
        self.log: deque[dict[str, Any]] = deque(maxlen=config.request_log_size or None)

    # -- admission -------------------------------------------------------------------------
    def admit(self, body: Any) -> ReqState:
        """A new request from a ``/generate`` body (raises ContractError / RequestError)."""
        sp = check_body(body)
        input_ids = prompt_ids(body, self.tokenizer)
        rid = request_id(body)
        n_in = len(input_ids)
        check_lengths(n_in, sp, self.config.context_length)
        check_sampling_mask(body, sp)
        check_routed_experts(body, n_in, enabled=self.config.enable_return_routed_experts
                             or self.config.enable_return_indexer_topk)
        lora = body.get("lora_path")
        if lora is not None and not isinstance(lora, str):
            raise RequestError(f"lora_path must be a string, got {type(lora).__name__}")
        if rid in self.in_flight:
            raise RequestError(f"Duplicate request ID detected: {rid}")
        entry = {"rid": rid, "input_ids": input_ids, "output_ids": None, "logprobs": None,
                 "finish_reason": None, "sampling_params": sp, "cached_tokens": None,
                 "weight_version": None, "stream": bool(body.get("stream")),
                 "arrived": time.time(), "faults": [], "lora_path": lora,
                 "return_routed_experts": bool(body.get("return_routed_experts")),
                 "routed_experts_start_len": body.get("routed_experts_start_len"),
                 "return_sampling_mask": bool(body.get("return_sampling_mask"))}
        return ReqState(rid, input_ids, sp, body, time.perf_counter(), entry)

    def register(self, req: ReqState) -> None:
        self.in_flight[req.rid] = req
        self.log.append(req.log)

    # -- generation ------------------------------------------------------------------------
    async def sleep(self, req: ReqState, seconds: float) -> None:
        """Sleep, waking early when ``req`` is aborted."""
        if seconds <= 0 or req.aborted:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(req.wake.wait(), seconds)

    async def wait_unpaused(self, req: ReqState) -> None:
        while self.paused and not req.aborted:
            await self.sleep(req, 0.005)

    def start(self, req: ReqState) -> None:
        """Look up the cached prefix and plan the whole completion."""
        sp = {k: v for k, v in req.sampling_params.items() if v is not None}
        ids = req.input_ids
        cap = len(ids) - 1
        start_len = req.body.get("logprob_start_len")
        if req.body.get("return_logprob") and start_len is not None and start_len >= 0:
            cap = min(cap, start_len)
        req.cached_tokens = max(0, min(self.cache.match(ids), cap))
        self.cache.insert(ids)
        stop = sp.get("stop", ())
        stop_regex = sp.get("stop_regex", ())
        req.plan = self.model.plan(
            ids,
            max_new_tokens=sp.get("max_new_tokens", 128),
            min_new_tokens=sp.get("min_new_tokens", 0),
            stop_token_ids=sp.get("stop_token_ids", ()),
            ignore_eos=sp.get("ignore_eos", False),
            stop=[stop] if isinstance(stop, str) else stop,
            stop_regex=[stop_regex] if isinstance(stop_regex, str) else stop_regex,
        )
        req.started = True

    async def drive(self, req: ReqState) -> AsyncIterator[int]:
        """Run ``req``; yields the number of emitted tokens as they appear.

        Tokens appear at ``token_latency_ms`` each by the wall clock, like a GPU's
        decode that goes on whatever the HTTP side does: when the event loop was busy
        (a stream writer encoding a long chunk), the tokens due meanwhile appear at
        once. At latency 0 the whole completion appears at once."""
        await self.wait_unpaused(req)
        if req.aborted:
            return
        self.start(req)
        assert req.plan is not None
        req.versions = [(self.weight_version, 0)]
        await self.sleep(req, self.config.latency_ms / 1000)
        total = len(req.plan.output_ids)
        per_token = self.config.token_latency_ms / 1000
        if per_token <= 0 and not self.paused and not req.aborted:
            req.emitted = total
            yield total
            return
        began = time.perf_counter()
        while req.emitted < total and not req.aborted:
            await self.sleep(req, per_token)
            if self.paused:
                await self.wait_unpaused(req)
                began = time.perf_counter() - req.emitted * per_token
            if req.aborted:
                break
            if self.weight_version != req.versions[-1][0]:  # updated while paused
                req.versions.append((self.weight_version, req.emitted))
            due = int((time.perf_counter() - began) / per_token) if per_token > 0 else total
            req.emitted = min(total, max(req.emitted + 1, due))
            yield req.emitted

    def finish(self, req: ReqState) -> None:
        """Retire ``req``: fill its log entry and cache what it produced."""
        if req.finished:
            return
        req.finished = True
        self.in_flight.pop(req.rid, None)
        entry = req.log
        entry["weight_version"] = self.weight_version
        entry["e2e_latency"] = time.perf_counter() - req.arrived
        if req.plan is None:  # aborted while waiting
            entry.update(output_ids=[], logprobs=[],
                         finish_reason=abort_reason(WAITING_ABORT_MESSAGE))
            return
        n = req.emitted
        out = req.plan.output_ids[:n]
        complete = n == len(req.plan.output_ids) and not req.aborted
        entry.update(output_ids=out, logprobs=req.plan.logprobs[:n],
                     finish_reason=req.plan.finish_reason if complete else abort_reason(),
                     cached_tokens=req.cached_tokens, prompt_tokens=len(req.input_ids),
                     completion_tokens=n, num_retractions=req.num_retractions)
        self.cache.insert(req.input_ids + out[:-1])

    # -- control -----------------------------------------------------------------------------
    def abort(self, req: ReqState) -> None:
        if not req.finished:
            req.aborted = True
            req.wake.set()

    def abort_matching(self, rid: str, *, abort_all: bool) -> None:
        """``/abort_request``: every request, or those whose rid starts with ``rid``
        (only when ``rid`` itself is in flight)."""
        if abort_all:
            targets = list(self.in_flight.values())
        elif rid and rid in self.in_flight:
            targets = [r for k, r in self.in_flight.items() if k.startswith(rid)]
        else:
            targets = []
        for req in targets:
            self.abort(req)

    def abort_all(self) -> None:
        for req in list(self.in_flight.values()):
            self.abort(req)

    def pause(self, mode: str) -> None:
        """``/pause_generation`` with a mode of :data:`PAUSE_MODES`."""
        self.paused = True
        self.pause_mode = mode
        for req in list(self.in_flight.values()):
            if mode == "abort":
                self.abort(req)
            elif mode == "retract" and req.started and not req.finished:
                req.num_retractions += 1

    def resume(self) -> None:
        self.paused = False
        self.pause_mode = None
