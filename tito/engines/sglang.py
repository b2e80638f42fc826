"""SGLang client: native ``POST /generate`` with ``input_ids`` (design §8).

One sample per request with our own ``rid``; explicit sampling parameters (SGLang's
defaults differ from OpenAI's; structured output as ``sampling_params.json_schema``);
``output_ids`` are the truth and ``meta_info.output_token_logprobs`` (``[logprob, id,
text|null]``) must agree with them (:mod:`tito.engines.sglang_reply` checks every reply).
Requests go over the shared HTTP transport (:mod:`tito.engines.transport`: one pooled
keep-alive aiohttp session, the one safe stale-connection retry, short probes); bodies are
encoded with orjson (numpy id arrays serialize without a Python list), and a session's
``input_ids`` text is built on its previous prompt's (:mod:`tito.engines.prompt_json`:
O(new ids) a turn). Streams are read in either of SGLang's stream modes, in linear total
work (:mod:`tito.engines.sglang_stream`).

Errors: a transport failure or an engine 5xx is an :class:`EngineError` (code
``engine_error``); a reply we cannot use (not JSON, a field of the wrong type or out of
range) an :class:`EngineError` with code ``engine_protocol_error``; a timeout an
:class:`EngineTimeout`; an engine 4xx an :class:`EngineRejected` with the engine's status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from tito.engines.prompt_json import PromptJson, prompt_key
from tito.engines.sglang_reply import PROTOCOL_ERROR as PROTOCOL_ERROR
from tito.engines.sglang_reply import max_model_len
from tito.engines.sglang_reply import parse_generate_response as parse_generate_response
from tito.engines.sglang_reply import protocol_error as protocol_error
from tito.engines.sglang_stream import StreamAssembler
from tito.engines.transport import (
    JSON_HEADERS,
    JSON_OPTS,
    KEEPALIVE_TIMEOUT_S,
    MODELS_TIMEOUT_S,
    PROBE_TIMEOUT_S,
    HttpTransport,
    error_text,
    sse_data,
)
from tito.engines.transport import closed_before_reply as closed_before_reply
from tito.types.engine import (
    EngineStats,
    GenerateResult,
    PauseMode,
    ReplayRequest,
    SamplingParams,
    StreamChunk,
    TokenIds,
)
from tito.types.errors import EngineError, EngineRejected
from tito.types.placement import session_of

log = logging.getLogger("tito.engines")

CUMULATIVE_HINT_IDS = 4096
"""A cumulative stream this long logs (once per client) that SGLang's
``--incremental-streaming-output`` would cost the engine and the gateway less."""
CONTEXT_RETRY_S = 5.0
"""After a failed or unusable ``/v1/models`` answer, ask again at most this often."""


def sampling_payload(params: SamplingParams) -> dict[str, Any]:
    """SGLang ``sampling_params`` with every value explicit."""
    out: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "min_p": params.min_p,
        "frequency_penalty": params.frequency_penalty,
        "presence_penalty": params.presence_penalty,
        "repetition_penalty": params.repetition_penalty,
        "no_stop_trim": True,
        "skip_special_tokens": False,
    }
    if params.stop:
        out["stop"] = list(params.stop)
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    if params.json_schema is not None:
        out["json_schema"] = params.json_schema  # structured output: a grammar constraint
    return out


def routing_headers(rid: str) -> dict[str, str]:
    """A ``/generate`` request's headers: JSON, and the session as the routing key of
    SGLang's router (``X-SMG-Routing-Key``, its consistent-hashing policy), so that one
    ``--engine-url`` pointing at the router keeps each session on one engine."""
    return {**JSON_HEADERS, "x-smg-routing-key": session_of(rid)}


class SGLangEngine:
    """An SGLang server (or anything speaking its native ``/generate``).

    Every request but a stream goes through :meth:`_request` over an
    :class:`~tito.engines.transport.HttpTransport` (:attr:`http`): one pooled keep-alive
    session whose idle connections are dropped after ``keepalive_timeout`` seconds (under
    SGLang's 5 s), and one safe resend of a request whose reused pooled connection the
    engine had closed before any byte of the reply, counted in :attr:`stale_retries`
    (the exact rule: :class:`~tito.engines.transport.HttpTransport`). Transport failures
    are :class:`EngineError` (``engine_error``, cause chained), timeouts
    :class:`EngineTimeout`.

    ``vocab_size``: when given, an output id >= it is a protocol error.
    """

    name = "sglang"
    enforces_json_schema = True
    """Structured output is a grammar constraint (``sampling_params.json_schema``)."""

    def __init__(self, url: str, *, timeout: float = 600.0, max_connections: int = 1024,
                 keepalive_timeout: float = KEEPALIVE_TIMEOUT_S, vocab_size: int | None = None,
                 lora_path: str | None = None, stream_interval: int = 1):
        self.http = HttpTransport(url, timeout=timeout, max_connections=max_connections,
                                  keepalive_timeout=keepalive_timeout)
        self.url = self.http.url
        self.stream_interval = stream_interval
        """Ids per stream chunk of a streamed turn (SGLang ``stream_interval``)."""
        self.lora_path = lora_path
        """LoRA adapter name sent as ``lora_path`` on every request (``--lora-name``)."""
        self.timeout = timeout
        self.max_connections = max_connections
        self.keepalive_timeout = keepalive_timeout
        self.vocab_size = vocab_size
        self._context_length: int | None = None
        self._context_retry_at = 0.0
        self._context_lock = asyncio.Lock()
        self.prompt_json = PromptJson()
        """Each session's previous prompt text: a turn serializes only its new ids."""
        self._hinted = False

    @property
    def stale_retries(self) -> int:
        """Requests sent again on a fresh connection after a stale pooled one failed."""
        return self.http.stale_retries

    def stats(self) -> EngineStats:
        return EngineStats(self.name, self.url, self.http.stale_retries)

    # -- transport ---------------------------------------------------------------------
    async def _request(self, method: str, path: str, body: bytes | None = None, *,
                       timeout: float | None = None,
                       headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(status, body) of one request (the transport's, with its one safe retry)."""
        return await self.http.request(method, path, body, timeout=timeout, headers=headers)

    async def _post(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        return await self._request("POST", path, orjson.dumps(payload, option=JSON_OPTS))

    # -- generation --------------------------------------------------------------------
    def _generate_payload(self, input_ids: TokenIds, params: SamplingParams, rid: str,
                          replay: ReplayRequest | None, *, stream: bool) -> bytes:
        sampling = sampling_payload(params)
        if stream:
            sampling["stream_interval"] = self.stream_interval
        payload: dict[str, Any] = {
            "rid": rid,
            "sampling_params": sampling,
            "return_logprob": True,
            "logprob_start_len": -1,
            "stream": stream,
        }
        if self.lora_path is not None:
            payload["lora_path"] = self.lora_path
        if replay is not None and replay.routed_experts:
            payload["return_routed_experts"] = True
            payload["routed_experts_start_len"] = replay.start_len
        if replay is not None and replay.indexer_topk:
            payload["return_indexer_topk"] = True
        if replay is not None and replay.sampling_mask:
            payload["return_sampling_mask"] = True
        # {"input_ids": [...], "rid": ...}: the ids' text spliced in (O(new ids) a turn)
        return self.prompt_json.payload(prompt_key(rid), input_ids, b'{"input_ids":',
                                        b"," + orjson.dumps(payload, option=JSON_OPTS)[1:])

    @staticmethod
    def _refusal(status: int, body: bytes) -> EngineError:
        message = error_text(body)
        if 400 <= status < 500:
            return EngineRejected(f"engine rejected the request: {message}",
                                  engine_status=status)
        return EngineError(f"engine answered HTTP {status}: {message}")

    async def generate(
        self,
        input_ids: TokenIds,
        params: SamplingParams,
        rid: str,
        *,
        replay: ReplayRequest | None = None,
    ) -> GenerateResult:
        start = time.perf_counter()
        self.prompt_json.begin()
        try:
            status, body = await self._request(
                "POST", "/generate", self._generate_payload(input_ids, params, rid, replay,
                                                            stream=False),
                headers=routing_headers(rid))
        finally:
            self.prompt_json.end()
        if status != 200:
            raise self._refusal(status, body)
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise protocol_error(f"engine reply for {rid} is not JSON: {exc}") from exc
        result = parse_generate_response(data, rid=rid, vocab_size=self.vocab_size)
        if result.e2e_latency is None:
            result.e2e_latency = time.perf_counter() - start
        return result

    async def generate_stream(
        self,
        input_ids: TokenIds,
        params: SamplingParams,
        rid: str,
        *,
        replay: ReplayRequest | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """``/generate`` with ``stream: true`` (``stream_interval`` ids per chunk), in
        either of SGLang's stream modes (cumulative chunks by default, deltas with
        ``--incremental-streaming-output``; :mod:`tito.engines.sglang_stream` tells them
        apart and reads a cumulative chunk past what it already has). Every chunk's new
        ids and logprobs are checked; the final chunk's whole result is checked as a
        reply. Not retried: a stream is not resent."""
        start = time.perf_counter()
        body = self._generate_payload(input_ids, params, rid, replay, stream=True)
        assembler = StreamAssembler(rid, self.vocab_size)
        self.prompt_json.begin()
        try:
            async with self.http.stream("/generate", body, routing_headers(rid)) as resp:
                if resp.status != 200:
                    raise self._refusal(resp.status, await resp.read())
                async for data in sse_data(resp.content):
                    if data == b"[DONE]":
                        break
                    out = assembler.feed(data)
                    if isinstance(out, GenerateResult):
                        if out.e2e_latency is None:
                            out.e2e_latency = time.perf_counter() - start
                        self._hint(assembler)
                        yield StreamChunk(out.output_ids, out)
                        return
                    if out is not None:
                        yield StreamChunk(out)
        finally:
            self.prompt_json.end()
        raise protocol_error(f"the stream of {rid} ended without a finish_reason")

    def _hint(self, assembler: StreamAssembler) -> None:
        if assembler.mode == "cumulative" and len(assembler.ids) >= CUMULATIVE_HINT_IDS \
                and not self._hinted:
            self._hinted = True
            log.warning("%s streams cumulatively (every chunk holds all ids so far: "
                        "bytes grow with the square of a turn's length); start SGLang with "
                        "--incremental-streaming-output for long streamed turns", self.url)

    # -- information -------------------------------------------------------------------
    async def context_length(self) -> int | None:
        """The engine's ``max_model_len`` from ``GET /v1/models``; None while unknown.

        Only a positive integer is cached. A failed or unusable answer gives None and is
        asked again on a later call, at most once per :data:`CONTEXT_RETRY_S` seconds.
        """
        if self._context_length is not None:
            return self._context_length
        async with self._context_lock:  # concurrent first turns share one request
            if self._context_length is None and time.monotonic() >= self._context_retry_at:
                self._context_length = await self._fetch_context_length()
                if self._context_length is None:
                    self._context_retry_at = time.monotonic() + CONTEXT_RETRY_S
        return self._context_length

    async def _fetch_context_length(self) -> int | None:
        timeout = min(self.timeout, MODELS_TIMEOUT_S)
        try:
            status, body = await self._request("GET", "/v1/models", timeout=timeout)
            return max_model_len(orjson.loads(body)) if status == 200 else None
        except (EngineError, orjson.JSONDecodeError):
            return None

    async def probe(self) -> str | None:
        """None when ``GET /health`` answers 200 within :data:`PROBE_TIMEOUT_S` seconds,
        else a short reason."""
        return await self.http.probe("/health", PROBE_TIMEOUT_S)

    async def health(self) -> bool:
        return await self.probe() is None

    # -- control -----------------------------------------------------------------------
    async def abort(self, rid: str) -> None:
        await self._post("/abort_request", {"rid": rid})

    async def _control(self, path: str, payload: dict[str, Any]) -> None:
        """A control call; an engine that refuses it raises (its status kept)."""
        status, body = await self._post(path, payload)
        if 400 <= status < 500:
            raise EngineRejected(f"engine refused {path}: {error_text(body)}",
                                 engine_status=status)
        if status >= 300:
            raise EngineError(f"engine answered HTTP {status} to {path}: {error_text(body)}")

    async def pause(self, mode: PauseMode = "retract") -> None:
        await self._control("/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        await self._control("/continue_generation", {})

    async def update_weight_version(self, version: str) -> None:
        await self._control("/update_weight_version", {"new_version": version})

    async def close(self) -> None:
        await self.http.close()

