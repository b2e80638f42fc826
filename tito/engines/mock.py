"""``tito mock-engine``: a CPU HTTP server faithful to SGLang 0.5.x native ``/generate``.

Same routes, fields and shapes as SGLang (see ``shared/reference/engine-apis.md`` §1 and
§4): ``input_ids`` in, ``output_ids`` (stop id included) and ``[logprob, id, text|null]``
triples out, finish-reason objects (``stop``/``length``/``abort``), a simulated radix
cache (``cached_tokens``), abort by rid prefix, pause/continue, weight version, fake MoE
routing replay, HTTP 400 on unknown ``sampling_params`` keys. The "model" is scripted by
directives in the last user/tool message (:mod:`tito.engines.mock_directives`).

Test hooks: ``GET /mock/requests`` (the request log in arrival order) and
``DELETE /mock/requests``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import math
import sys
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tito.engines.mock_directives import MockModel, Plan, prompt_digest, token_logprob
from tito.net import bind_tcp, serve_forever

SAMPLING_KEYS = (
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "stop", "stop_token_ids",
    "stop_regex", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "n", "sampling_seed", "logit_bias", "json_schema", "regex", "ebnf",
    "structural_tag", "stream_interval", "custom_params",
)
_INT_KEYS = ("max_new_tokens", "min_new_tokens", "top_k", "n", "sampling_seed", "stream_interval")
_FLOAT_KEYS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
               "repetition_penalty")
_BOOL_KEYS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
              "no_stop_trim")
_STR_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")
ABORTED_MESSAGE = "Aborted"
WAITING_ABORT_MESSAGE = "Abort in waiting queue"
FLUSH_TEXT = ("Cache flushed.\nPlease check backend logs for more details. (When there are "
              "running or waiting requests, the operation will not be performed.)\n")


class ContractError(Exception):
    """A request that breaks the JSON contract: ``400 {"error": "<text>"}``."""


class RequestError(Exception):
    """A request SGLang rejects with a ValueError: ``400 {"error": {"message": ...}}``."""


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _contract_error(text: str) -> Response:
    return _json({"error": text}, 400)


def _value_error(message: str) -> Response:
    return _json({"error": {"message": message}}, 400)


def _abort_reason(message: str = ABORTED_MESSAGE) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


# -- validation --------------------------------------------------------------------------
def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f"string {orjson.dumps(value).decode()}"
    if isinstance(value, list):
        return "a sequence"
    return "a map"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _expect(key: str, value: Any, ok: bool, expected: str) -> None:
    if not ok:
        raise ContractError(f"invalid type: {_type_name(value)}, expected {expected} "
                            f"(field `{key}`)")


def check_sampling_params(sp: Any) -> dict[str, Any]:
    """The JSON contract of ``sampling_params`` (unknown keys rejected) and SGLang's verify()."""
    if sp is None:
        return {}
    if not isinstance(sp, dict):
        raise ContractError(f"invalid type: {_type_name(sp)}, expected struct SamplingParams "
                            "(field `sampling_params`)")
    for key in sp:
        if key not in SAMPLING_KEYS:
            expected = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            raise ContractError(f"unknown field `{key}`, expected one of {expected}")
    for key, value in sp.items():
        if value is None:
            continue
        if key in _INT_KEYS:
            _expect(key, value, _is_int(value), "an integer")
        elif key in _FLOAT_KEYS:
            _expect(key, value, _is_number(value), "a number")
        elif key in _BOOL_KEYS:
            _expect(key, value, isinstance(value, bool), "a boolean")
        elif key in ("stop", "stop_regex"):
            ok = isinstance(value, str) or (
                isinstance(value, list) and all(isinstance(s, str) for s in value))
            _expect(key, value, ok, "a string or a sequence of strings")
        elif key == "stop_token_ids":
            ok = isinstance(value, list) and all(_is_int(t) for t in value)
            _expect(key, value, ok, "a sequence of integers")
        elif key in ("logit_bias", "custom_params"):
            _expect(key, value, isinstance(value, dict), "a map")
        elif key in _STR_KEYS:
            _expect(key, value, isinstance(value, str) or key == "structural_tag", "a string")
    # SamplingParams.verify(): ValueErrors -> 400 {"error": {"message"}}
    g = {k: v for k, v in sp.items() if v is not None}
    if g.get("temperature", 1.0) < 0.0:
        raise RequestError(f"temperature must be non-negative, got {g['temperature']}.")
    if not 0.0 < g.get("top_p", 1.0) <= 1.0:
        raise RequestError(f"top_p must be in (0, 1], got {g['top_p']}.")
    if not 0.0 <= g.get("min_p", 0.0) <= 1.0:
        raise RequestError(f"min_p must be in [0, 1], got {g['min_p']}.")
    top_k = g.get("top_k", -1)
    if top_k < 1 and top_k != -1:
        raise RequestError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if not -2.0 <= g.get("frequency_penalty", 0.0) <= 2.0:
        raise RequestError("frequency_penalty must be in [-2, 2], got "
                           f"{g['frequency_penalty']}.")
    if not -2.0 <= g.get("presence_penalty", 0.0) <= 2.0:
        raise RequestError(f"presence_penalty must be in [-2, 2], got {g['presence_penalty']}.")
    if not 0.0 < g.get("repetition_penalty", 1.0) <= 2.0:
        raise RequestError("repetition_penalty must be in (0, 2], got "
                           f"{g['repetition_penalty']}.")
    max_new = g.get("max_new_tokens", 128)
    if max_new < 0:
        raise RequestError(f"max_new_tokens must be at least 0, got {max_new}.")
    min_new = g.get("min_new_tokens", 0)
    if not 0 <= min_new <= max_new:
        raise RequestError(f"min_new_tokens must be in [0, max_new_tokens({max_new})], "
                           f"got {min_new}.")
    if g.get("n", 1) != 1:
        raise RequestError("the mock engine serves one sample per request (n = 1); "
                           "fan out in the client")
    return sp


# -- radix cache ---------------------------------------------------------------------------
class RadixCache:
    """Longest cached prefix of a token sequence, page-keyed for speed (exact per token)."""

    PAGE = 16

    def __init__(self, max_pages: int = 1 << 18) -> None:
        self.root: dict[bytes, Any] = {}
        self.pages = 0
        self.max_pages = max_pages
        """Bound on memory (4M tokens by default): beyond it everything is evicted."""

    @staticmethod
    def _bytes(ids: Sequence[int]) -> bytes:
        return np.asarray(ids, dtype="<i4").tobytes()

    def match(self, ids: Sequence[int]) -> int:
        data = self._bytes(ids)
        step = self.PAGE * 4
        node, pos = self.root, 0
        while True:
            key = data[pos : pos + step]
            child = node.get(key) if len(key) == step else None
            if child is not None:
                node, pos = child, pos + step
                continue
            best = 0
            for k in node:
                n = min(len(k), len(key))
                i = 0
                while i < n and k[i : i + 4] == key[i : i + 4]:
                    i += 4
                best = max(best, i)
            return (pos + best) // 4

    def insert(self, ids: Sequence[int]) -> None:
        data = self._bytes(ids)
        step = self.PAGE * 4
        if self.pages + len(data) // step > self.max_pages:
            self.clear()
        node, pos = self.root, 0
        while pos + step <= len(data):
            key = data[pos : pos + step]
            child = node.get(key)
            if child is None:
                child = node[key] = {}
                self.pages += 1
            node, pos = child, pos + step
        tail = data[pos:]
        if tail and tail not in node:
            node[tail] = None  # a partial page: a leaf

    def clear(self) -> None:
        self.root = {}
        self.pages = 0


# -- requests ------------------------------------------------------------------------------
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
    request_log_size: int = 1000


class MockEngine:
    """State and routes of one mock engine process."""

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
        self.served_model_name = config.served_model_name or config.tokenizer_dir
        self._token_text: dict[int, str] = {}

    # -- helpers ---------------------------------------------------------------------------
    def token_text(self, tok: int) -> str:
        text = self._token_text.get(tok)
        if text is None:
            text = self._token_text[tok] = self.tokenizer.decode([tok])
        return text

    async def _sleep(self, req: ReqState, seconds: float) -> None:
        """Sleep, waking early when ``req`` is aborted."""
        if seconds <= 0 or req.aborted:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(req.wake.wait(), seconds)

    async def _wait_unpaused(self, req: ReqState) -> None:
        while self.paused and not req.aborted:
            await self._sleep(req, 0.005)

    def _abort(self, req: ReqState) -> None:
        if not req.finished:
            req.aborted = True
            req.wake.set()

    # -- generation ------------------------------------------------------------------------
    def _parse_generate(self, body: Any) -> tuple[ReqState | None, Response | None]:
        if not isinstance(body, dict):
            return None, _contract_error(
                f"invalid type: {_type_name(body)}, expected struct GenerateRequest")
        sp = check_sampling_params(body.get("sampling_params"))
        for key in ("return_logprob", "stream", "return_text_in_logprobs",
                    "return_prompt_token_ids", "return_routed_experts"):
            value = body.get(key)
            if value is not None:
                _expect(key, value, isinstance(value, bool), "a boolean")
        for key in ("logprob_start_len", "top_logprobs_num", "routed_experts_start_len"):
            value = body.get(key)
            if value is not None:
                _expect(key, value, _is_int(value), "an integer")
        input_ids = body.get("input_ids")
        text = body.get("text")
        if body.get("input_embeds") is not None:
            raise RequestError("the mock engine does not take input_embeds")
        if (input_ids is None) == (text is None):
            raise RequestError("Either text, input_ids or input_embeds should be provided.")
        if text is not None:
            if isinstance(text, list):
                raise RequestError("the mock engine serves one prompt per request (no batch)")
            _expect("text", text, isinstance(text, str), "a string")
            input_ids = self.tokenizer.encode(text)
        if not isinstance(input_ids, list) or not all(_is_int(t) for t in input_ids):
            if isinstance(input_ids, list) and input_ids and all(
                    isinstance(x, list) for x in input_ids):
                raise RequestError("the mock engine serves one prompt per request (no batch)")
            _expect("input_ids", input_ids, False, "a sequence of integers")
        if not input_ids:
            raise RequestError("input_ids cannot be empty.")
        vocab = self.tokenizer.vocab_size
        bad = next((t for t in input_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"The input_ids {bad} >= the vocab_size {vocab}.")
        rid = body.get("rid")
        if rid is None:
            rid = uuid.uuid4().hex
        elif isinstance(rid, list):
            raise RequestError("the mock engine serves one prompt per request (no batch)")
        _expect("rid", rid, isinstance(rid, str), "a string")
        n_in = len(input_ids)
        ctx = self.config.context_length
        if n_in >= ctx:
            raise RequestError(f"The input ({n_in} tokens) is longer than the model's "
                               f"context length ({ctx} tokens).")
        max_new = sp.get("max_new_tokens")
        if max_new is not None and max_new + n_in >= ctx:
            raise RequestError(
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {max_new + n_in} tokens: {n_in} tokens from "
                f"the input messages and {max_new} tokens for the completion. Please reduce "
                "the number of tokens in the input messages or the completion to fit within "
                "the limit.")
        if body.get("return_routed_experts") and self.config.enable_return_routed_experts:
            start = body.get("routed_experts_start_len") or 0
            if not 0 <= start <= n_in:
                raise RequestError(f"routed_experts_start_len ({start}) must be in "
                                   f"[0, {n_in}] (the prompt length)")
        if rid in self.in_flight:
            raise RequestError(f"Duplicate request ID detected: {rid}")
        entry = {"rid": rid, "input_ids": input_ids, "output_ids": None, "logprobs": None,
                 "finish_reason": None, "sampling_params": sp, "cached_tokens": None,
                 "weight_version": None, "stream": bool(body.get("stream")),
                 "arrived": time.time()}
        req = ReqState(rid, input_ids, sp, body, time.perf_counter(), entry)
        return req, None

    def _register(self, req: ReqState) -> None:
        self.in_flight[req.rid] = req
        self.log.append(req.log)

    def _start(self, req: ReqState) -> None:
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

    async def _drive(self, req: ReqState) -> AsyncIterator[int]:
        """Run ``req``; yields the number of emitted tokens as they appear."""
        await self._wait_unpaused(req)
        if req.aborted:
            return
        self._start(req)
        assert req.plan is not None
        await self._sleep(req, self.config.latency_ms / 1000)
        total = len(req.plan.output_ids)
        per_token = self.config.token_latency_ms / 1000
        if per_token <= 0 and not self.paused and not req.aborted:
            req.emitted = total
            yield total
            return
        while req.emitted < total and not req.aborted:
            await self._sleep(req, per_token)
            if self.paused:
                await self._wait_unpaused(req)
            if req.aborted:
                break
            req.emitted += 1
            yield req.emitted

    def _finish(self, req: ReqState) -> None:
        if req.finished:
            return
        req.finished = True
        self.in_flight.pop(req.rid, None)
        entry = req.log
        entry["weight_version"] = self.weight_version
        entry["e2e_latency"] = time.perf_counter() - req.arrived
        if req.plan is None:  # aborted while waiting
            entry.update(output_ids=[], logprobs=[],
                         finish_reason=_abort_reason(WAITING_ABORT_MESSAGE))
            return
        n = req.emitted
        out = req.plan.output_ids[:n]
        complete = n == len(req.plan.output_ids) and not req.aborted
        entry.update(output_ids=out, logprobs=req.plan.logprobs[:n],
                     finish_reason=req.plan.finish_reason if complete else _abort_reason(),
                     cached_tokens=req.cached_tokens, prompt_tokens=len(req.input_ids),
                     completion_tokens=n, num_retractions=req.num_retractions)
        self.cache.insert(req.input_ids + out[:-1])

    def _result(self, req: ReqState, *, final: bool, upto: int | None = None) -> dict[str, Any]:
        """The response object (``upto``: a non-final stream chunk of that many tokens)."""
        body = req.body
        rid = req.rid
        if req.plan is None:  # aborted in the waiting queue: SGLang's reduced meta_info
            return {"text": "", "output_ids": [], "meta_info": {
                "id": rid, "finish_reason": _abort_reason(WAITING_ABORT_MESSAGE),
                "weight_version": self.weight_version,
                "e2e_latency": time.perf_counter() - req.arrived, "completion_tokens": 0}}
        plan = req.plan
        n = req.emitted if upto is None else upto
        out = plan.output_ids[:n]
        if final:
            complete = n == len(plan.output_ids) and not req.aborted
            finish: dict[str, Any] | None = plan.finish_reason if complete else _abort_reason()
        else:
            finish = None
        sp = req.sampling_params
        skip_special = sp.get("skip_special_tokens")
        skip_special = True if skip_special is None else skip_special
        no_trim = bool(sp.get("no_stop_trim"))
        text_ids = out
        matched = finish.get("matched") if finish and finish["type"] == "stop" else None
        if isinstance(matched, int) and not no_trim:
            text_ids = out[:-1]
        text = self.tokenizer.decode(text_ids, skip_special_tokens=skip_special)
        if isinstance(matched, str) and not no_trim:
            cut = text.find(matched)
            if cut >= 0:
                text = text[:cut]
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(req.input_ids),
            "weight_version": self.weight_version,
            "reasoning_tokens": 0,
            "completion_tokens": n,
            "cached_tokens": req.cached_tokens,
            "num_retractions": req.num_retractions,
        }
        if final:
            meta["e2e_latency"] = time.perf_counter() - req.arrived
        if body.get("return_logprob"):
            with_text = bool(body.get("return_text_in_logprobs"))
            meta["output_token_logprobs"] = [
                [lp, tok, self.token_text(tok) if with_text else None]
                for lp, tok in zip(plan.logprobs[:n], out, strict=True)
            ]
            meta["output_token_logprobs_length"] = n
            meta["input_token_logprobs"] = self._input_logprobs(req, with_text)
            k = body.get("top_logprobs_num") or 0
            if k > 0:
                meta["output_top_logprobs"] = [
                    self._top(tok, lp, k, with_text)
                    for lp, tok in zip(plan.logprobs[:n], out, strict=True)
                ]
                meta["input_top_logprobs"] = [
                    None if entry[0] is None else self._top(entry[1], entry[0], k, with_text)
                    for entry in meta["input_token_logprobs"]
                ]
        if final and body.get("return_routed_experts") and \
                self.config.enable_return_routed_experts:
            meta["routed_experts"] = self._routed_experts(
                req.input_ids + out, body.get("routed_experts_start_len") or 0)
        result: dict[str, Any] = {"text": text, "output_ids": out, "meta_info": meta}
        if body.get("return_prompt_token_ids"):
            result["prompt_token_ids"] = req.input_ids
        return result

    def _input_logprobs(self, req: ReqState, with_text: bool) -> list[list[Any]]:
        start = req.body.get("logprob_start_len")
        if start is None or start < 0:
            return []
        digest = prompt_digest(req.input_ids)
        rows: list[list[Any]] = []
        for pos in range(start, len(req.input_ids)):
            tok = req.input_ids[pos]
            lp = None if pos == start else token_logprob(digest, pos, salt=b"in")
            rows.append([lp, tok, self.token_text(tok) if with_text else None])
        return rows

    def _top(self, tok: int, lp: float, k: int, with_text: bool) -> list[list[Any]]:
        """``k`` alternatives: the chosen token and others sharing the remaining mass."""
        vocab = self.tokenizer.vocab_size
        rest = max(1e-9, 1.0 - math.exp(lp))
        rows = [(lp, tok)]
        for j in range(1, k):
            rows.append((math.log(rest * 0.5**j), (tok + 7919 * j) % vocab))
        rows.sort(key=lambda r: -r[0])
        return [[v, t, self.token_text(t) if with_text else None] for v, t in rows]

    def _routed_experts(self, seq: list[int], start: int) -> str:
        """base64 of little-endian int32, shape (len(seq) - 1 - start, layers, topk)."""
        cfg = self.config
        end = max(start, len(seq) - 1)
        toks = np.asarray(seq[start:end], dtype=np.uint64)
        pos = np.arange(start, end, dtype=np.uint64)
        h = (toks * np.uint64(2654435761) + pos * np.uint64(40503)) & np.uint64(0xFFFFFFFF)
        layers = np.arange(cfg.num_layers, dtype=np.uint64) * np.uint64(0x9E3779B1)
        mixed = ((h[:, None] ^ layers[None, :]) * np.uint64(2246822519)) >> np.uint64(13)
        base = mixed % np.uint64(cfg.num_experts)
        experts = (base[:, :, None] + np.arange(cfg.topk, dtype=np.uint64)) % np.uint64(
            cfg.num_experts)
        return base64.b64encode(experts.astype("<i4").tobytes()).decode("ascii")

    # -- routes ----------------------------------------------------------------------------
    async def generate(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return _contract_error(f"{exc}")
        try:
            req, err = self._parse_generate(body)
        except ContractError as exc:
            return _contract_error(str(exc))
        except RequestError as exc:
            return _value_error(str(exc))
        if err is not None:
            return err
        assert req is not None
        self._register(req)
        if body.get("stream"):
            return StreamingResponse(self._stream(req), media_type="text/event-stream")
        watcher = None
        if self.config.latency_ms > 0 or self.config.token_latency_ms > 0 or self.paused:
            watcher = asyncio.create_task(self._watch_disconnect(request, req))
        try:
            async for _ in self._drive(req):
                pass
        finally:
            self._finish(req)
            if watcher is not None:
                watcher.cancel()
        return _json(self._result(req, final=True))

    async def _watch_disconnect(self, request: Request, req: ReqState) -> None:
        """A client that goes away aborts its request (SGLang notices within ~4 s)."""
        while not req.finished:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                if not req.finished:
                    self._abort(req)
                return

    async def _stream(self, req: ReqState) -> AsyncIterator[bytes]:
        interval = max(1, req.sampling_params.get("stream_interval") or 1)
        last = 0
        try:
            async for n in self._drive(req):
                total = len(req.plan.output_ids) if req.plan else 0
                # cumulative chunks every ``interval`` tokens; the final one comes after
                for upto in range(last + interval, min(n, total - 1) + 1, interval):
                    last = upto
                    chunk = self._result(req, final=False, upto=upto)
                    yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            self._finish(req)
            yield b"data: " + orjson.dumps(self._result(req, final=True)) + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            if not req.finished:  # client went away: abort, as SGLang does
                self._abort(req)
                self._finish(req)

    async def abort_request(self, request: Request) -> Response:
        body = await self._body(request)
        rid = body.get("rid")
        rid = rid if isinstance(rid, str) else ""
        if body.get("abort_all"):
            targets = list(self.in_flight.values())
        elif rid and rid in self.in_flight:
            targets = [r for k, r in self.in_flight.items() if k.startswith(rid)]
        else:
            targets = []
        for req in targets:
            self._abort(req)
        return Response(status_code=200)

    async def pause_generation(self, request: Request) -> Response:
        body = await self._body(request)
        mode = body.get("mode") or "abort"
        if mode not in ("abort", "retract", "in_place"):
            return _json({"detail": f"unknown pause mode {mode!r}"}, 422)
        self.paused = True
        self.pause_mode = mode
        for req in list(self.in_flight.values()):
            if mode == "abort":
                self._abort(req)
            elif mode == "retract" and req.started and not req.finished:
                req.num_retractions += 1
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: Request) -> Response:
        self.paused = False
        self.pause_mode = None
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weight_version(self, request: Request) -> Response:
        body = await self._body(request)
        version = body.get("new_version")
        if not isinstance(version, str):
            return _json({"detail": "new_version must be a string"}, 422)
        if body.get("abort_all_requests"):
            for req in list(self.in_flight.values()):
                self._abort(req)
        self.weight_version = version
        return _json({"success": True, "message": f"Weight version updated to {version}",
                      "new_version": version})

    async def flush_cache(self, request: Request) -> Response:
        if self.in_flight:
            return Response(FLUSH_TEXT, status_code=400, media_type="text/plain")
        self.cache.clear()
        return Response(FLUSH_TEXT, status_code=200, media_type="text/plain")

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=503 if self.paused else 200)

    async def model_info(self, request: Request) -> Response:
        cfg = self.config
        return _json({
            "model_path": cfg.tokenizer_dir,
            "served_model_name": self.served_model_name,
            "tokenizer_path": cfg.tokenizer_dir,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "load_format": "dummy",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "mock",
            "architectures": ["MockForCausalLM"],
            "mock": {"family": cfg.family, "context_length": cfg.context_length,
                     "num_hidden_layers": cfg.num_layers, "num_experts_per_tok": cfg.topk,
                     "num_experts": cfg.num_experts,
                     "enable_return_routed_experts": cfg.enable_return_routed_experts},
        })

    async def server_info(self, request: Request) -> Response:
        cfg = self.config
        return _json({
            "version": "0.5.23-tito-mock",
            "model_path": cfg.tokenizer_dir,
            "served_model_name": self.served_model_name,
            "context_length": cfg.context_length,
            "weight_version": self.weight_version,
            "enable_return_routed_experts": cfg.enable_return_routed_experts,
            "internal_states": [{"paused": self.paused, "in_flight": len(self.in_flight)}],
        })

    async def models(self, request: Request) -> Response:
        name = self.served_model_name
        return _json({"object": "list", "data": [{
            "id": name, "object": "model", "created": 0, "owned_by": "sglang", "root": name,
            "parent": None, "max_model_len": self.config.context_length}]})

    async def tokenize(self, request: Request) -> Response:
        body = await self._body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            tokens: Any = [self.tokenizer.encode(p) for p in prompt]
            count: Any = [len(t) for t in tokens]
        elif isinstance(prompt, str):
            tokens = self.tokenizer.encode(prompt)
            count = len(tokens)
        else:
            return _value_error("prompt must be a string or a list of strings")
        return _json({"tokens": tokens, "count": count,
                      "max_model_len": self.config.context_length})

    async def detokenize(self, request: Request) -> Response:
        body = await self._body(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
            return _value_error("tokens must be a list of integers")
        skip = body.get("skip_special_tokens", True)
        return _json({"text": self.tokenizer.decode(tokens, skip_special_tokens=bool(skip))})

    async def mock_requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            n = len(self.log)
            self.log.clear()
            return _json({"cleared": n})
        return _json(list(self.log))

    @staticmethod
    async def _body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if not raw:
            return {}
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {}
        return body if isinstance(body, dict) else {}

    def app(self) -> Starlette:
        routes = [
            Route("/generate", self.generate, methods=["POST", "PUT"]),
            Route("/abort_request", self.abort_request, methods=["POST"]),
            Route("/pause_generation", self.pause_generation, methods=["POST"]),
            Route("/continue_generation", self.continue_generation, methods=["POST"]),
            Route("/update_weight_version", self.update_weight_version, methods=["POST"]),
            Route("/flush_cache", self.flush_cache, methods=["GET", "POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/health_generate", self.health, methods=["GET"]),
            Route("/ready", self.ready, methods=["GET"]),
            Route("/model_info", self.model_info, methods=["GET"]),
            Route("/get_model_info", self.model_info, methods=["GET"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/get_server_info", self.server_info, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/v1/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/v1/detokenize", self.detokenize, methods=["POST"]),
            Route("/mock/requests", self.mock_requests, methods=["GET", "DELETE"]),
        ]
        return Starlette(routes=routes)


# -- CLI -----------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``tito mock-engine``."""
    parser.add_argument("--tokenizer", required=True, metavar="DIR",
                        help="tokenizer folder (tokenizer.json or vocab.json + merges.txt) "
                             "used to decode prompts and render the scripted replies")
    parser.add_argument("--family", default="qwen3",
                        help="model family whose renderer writes the replies (qwen3, chatml, "
                             "smollm2, default)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=30000,
                        help="port to listen on (0: pick a free port); the bound address is "
                             "printed as 'tito mock-engine listening on http://HOST:PORT'")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="simulated prefill latency per request, in milliseconds")
    parser.add_argument("--token-latency-ms", type=float, default=0.0,
                        help="simulated decode latency per output token, in milliseconds "
                             "(requests run concurrently and can be aborted mid-generation)")
    parser.add_argument("--context-length", type=int, default=32768,
                        help="model context length: longer prompts (or prompt + "
                             "max_new_tokens) are rejected with SGLang's 400 messages")
    parser.add_argument("--weight-version", default="default",
                        help="initial weight version reported in meta_info.weight_version "
                             "(changed by POST /update_weight_version)")
    parser.add_argument("--served-model-name", default=None,
                        help="model name in /v1/models and /model_info (unset: the "
                             "tokenizer folder)")
    parser.add_argument("--enable-return-routed-experts", action="store_true",
                        help="serve fake MoE routing replay (meta_info.routed_experts) to "
                             "requests with return_routed_experts; omitted otherwise, as SGLang")
    parser.add_argument("--num-layers", type=int, default=4,
                        help="fake MoE layers per routed-experts row")
    parser.add_argument("--topk", type=int, default=2,
                        help="fake experts per token per layer in routed-experts rows")
    parser.add_argument("--num-experts", type=int, default=16,
                        help="fake number of experts (routed expert ids are in [0, N))")
    parser.add_argument("--request-log-size", type=int, default=1000,
                        help="requests kept in the GET /mock/requests log (oldest dropped; "
                             "0: unbounded)")
    parser.add_argument("--log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn log level")


def build_engine(config: MockConfig) -> MockEngine:
    from tito.render import build_renderer

    renderer = build_renderer(config.family, config.tokenizer_dir)
    return MockEngine(config, MockModel(renderer))


def run(args: argparse.Namespace) -> int:
    """Run the mock engine until interrupted."""

    config = MockConfig(
        tokenizer_dir=args.tokenizer, family=args.family, latency_ms=args.latency_ms,
        token_latency_ms=args.token_latency_ms, context_length=args.context_length,
        weight_version=args.weight_version, served_model_name=args.served_model_name,
        enable_return_routed_experts=args.enable_return_routed_experts,
        num_layers=args.num_layers, topk=args.topk, num_experts=args.num_experts,
        request_log_size=args.request_log_size,
    )
    if config.topk < 1 or config.num_layers < 1 or config.topk > config.num_experts:
        print("tito mock-engine: need 1 <= --topk <= --num-experts and --num-layers >= 1",
              file=sys.stderr)
        return 2
    if config.context_length < 2:
        print("tito mock-engine: --context-length must be at least 2", file=sys.stderr)
        return 2
    try:
        engine = build_engine(config)
    except Exception as exc:  # a bad tokenizer folder or family: a clean CLI error
        print(f"tito mock-engine: {exc}", file=sys.stderr)
        return 2
    try:
        sock = bind_tcp(args.host, args.port)
    except OSError as exc:
        print(f"tito mock-engine: cannot listen on {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 2
    serve_forever(engine.app(), sock, name="tito mock-engine", log_level=args.log_level,
                  lifespan="off", timeout_graceful_shutdown=2)
    return 0
