"""A vLLM server reached with token ids (``--engine vllm --engine-url URL``).

vLLM's chat route takes no prompt ids, so turns go to ``POST /v1/completions`` with the
prompt as a list of ids, ``return_token_ids: true`` (the generated ids, stop id included)
and ``logprobs: 0`` (the sampled token's logprob, one per generated id), every sampling
setting sent explicitly (vLLM's own defaults differ: ``max_tokens`` 16, the model's
``generation_config.json``). The served model name and ``max_model_len`` come from
``GET /v1/models``.

- structured output (a JSON schema in :class:`~tito.types.engine.SamplingParams`) is
  vLLM's ``structured_outputs: {"json": SCHEMA}`` (the field that replaced
  ``guided_json``; vLLM 0.32 has no other);
- finish reasons: ``stop`` (``stop_reason`` an int: the matched stop id; a string: the
  matched stop string; null: EOS), ``length``, ``abort``;
- logprobs are vLLM's ``--logprobs-mode`` (default ``raw_logprobs``: before temperature
  and top-p/k), recorded in each result's ``extra["logprobs_mode"]`` as the gateway was
  told (``logprobs_mode``);
- prefix-cache hits (``usage.prompt_tokens_details.cached_tokens``) only when vLLM runs
  with ``--enable-prompt-tokens-details``;
- routed experts (``choices[].routed_experts``, base64 ``.npy``, with vLLM's
  ``--enable-return-routed-experts``) become int32 rows;
- streaming: ``stream: true`` chunks carry the new ``token_ids`` and logprobs;
- transport: the one SGLang uses (:mod:`tito.engines.transport`): a pooled keep-alive
  session, the one safe resend of a request whose reused connection vLLM had closed
  before any byte of the reply, ``/health`` probed within 2 s and ``/v1/models`` asked
  within 10 s whatever the generation timeout;
- abort: ``POST /abort_requests`` (vLLM's RL routes, ``VLLM_SERVER_DEV_MODE=1``), and in
  any case the HTTP request is closed, which makes vLLM abort it; pause / resume:
  ``POST /pause?mode=`` and ``POST /resume`` where vLLM exposes them (else an error that
  says how to start it); weight versions: ``POST /update_weight_version`` where present,
  and recorded by the gateway in every case.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson

from tito.engines.prompt_json import PromptJson, prompt_key
from tito.engines.sglang_reply import MAX_TOKEN_ID
from tito.engines.transport import (
    JSON_OPTS,
    KEEPALIVE_TIMEOUT_S,
    MODELS_TIMEOUT_S,
    PROBE_TIMEOUT_S,
    HttpTransport,
    sse_data,
)
from tito.types.engine import (
    EngineStats,
    FinishReason,
    GenerateResult,
    PauseMode,
    ReplayRequest,
    SamplingParams,
    StreamChunk,
    TokenIds,
)
from tito.types.errors import EngineError, EngineRejected

PROTOCOL_ERROR = "engine_protocol_error"
PAUSE_MODES: dict[str, str] = {"abort": "abort", "in_place": "keep", "retract": "keep"}
"""Our pause modes -> vLLM's (``abort`` ends in-flight requests with their partial output;
``keep`` freezes them and resumes them later)."""


def _protocol(message: str) -> EngineError:
    return EngineError(f"vLLM reply: {message}", code=PROTOCOL_ERROR)


class VLLMEngine:
    name = "vllm"
    enforces_json_schema = True
    """Structured output is a constraint (``structured_outputs: {"json": ...}``)."""

    def __init__(self, url: str, *, timeout: float = 600.0, max_connections: int = 1024,
                 keepalive_timeout: float = KEEPALIVE_TIMEOUT_S,
                 lora_name: str | None = None, logprobs_mode: str = "raw_logprobs",
                 model: str | None = None) -> None:
        self.http = HttpTransport(url, timeout=timeout, max_connections=max_connections,
                                  keepalive_timeout=keepalive_timeout, label="vLLM")
        """Pooled keep-alive session, the one safe stale-connection retry, short probes."""
        self.url = self.http.url
        self.timeout = timeout
        self.max_connections = max_connections
        self.keepalive_timeout = keepalive_timeout
        self.lora_name = lora_name
        self.logprobs_mode = logprobs_mode
        self.model = model
        self._max_model_len: int | None = None
        self.weight_version: str = "default"
        self._lock = asyncio.Lock()
        self.prompt_json = PromptJson()
        """Each session's previous prompt text: a turn serializes only its new ids."""

    @property
    def stale_retries(self) -> int:
        """Requests sent again on a fresh connection after a stale pooled one failed."""
        return self.http.stale_retries

    def stats(self) -> EngineStats:
        return EngineStats(self.name, self.url, self.http.stale_retries)

    async def _models(self) -> None:
        """The served model name (``self.model`` unless given) and ``max_model_len``."""
        async with self._lock:
            if self.model is not None and self._max_model_len is not None:
                return
            status, body = await self._call("GET", "/v1/models",
                                            timeout=min(self.timeout, MODELS_TIMEOUT_S))
            if status != 200:
                raise EngineError(f"vLLM answered HTTP {status} to /v1/models")
            data = orjson.loads(body).get("data") or []
            if not data:
                raise _protocol("/v1/models lists no model")
            self.model = self.model or self.lora_name or data[0]["id"]
            length = data[0].get("max_model_len")
            self._max_model_len = length if isinstance(length, int) else None

    async def _call(self, method: str, path: str, payload: Any = None, *,
                    timeout: float | None = None) -> tuple[int, bytes]:
        """(status, body) of one request over the shared transport (its one safe retry);
        ``payload``: bytes as they are, anything else as JSON."""
        body = payload if payload is None or isinstance(payload, bytes) else \
            orjson.dumps(payload, option=JSON_OPTS)
        return await self.http.request(method, path, body, timeout=timeout)

    def _payload(self, input_ids: TokenIds, params: SamplingParams, rid: str,
                 replay: ReplayRequest | None, *, stream: bool) -> bytes:
        """The ``/v1/completions`` body (the prompt's ids spliced in as JSON text)."""
        payload: dict[str, Any] = {
            "model": self.model,
            "max_tokens": params.max_new_tokens, "temperature": params.temperature,
            "top_p": params.top_p, "top_k": params.top_k, "min_p": params.min_p,
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
            "repetition_penalty": params.repetition_penalty,
            "stop": list(params.stop), "stop_token_ids": list(params.stop_token_ids),
            "include_stop_str_in_output": True, "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "logprobs": 0, "return_token_ids": True, "request_id": rid, "stream": stream,
        }
        if params.seed is not None:
            payload["seed"] = params.seed
        if params.json_schema is not None:  # structured output (vLLM >= 0.10.2's field)
            payload["structured_outputs"] = {"json": params.json_schema}
        if stream:
            payload["stream_options"] = {"include_usage": True}
        if replay is not None and replay.routed_experts:
            payload["routed_experts_prompt_start"] = replay.start_len
        return self.prompt_json.payload(prompt_key(rid), input_ids, b'{"prompt":',
                                        b"," + orjson.dumps(payload)[1:])

    @staticmethod
    def _refusal(status: int, body: bytes) -> EngineError:
        try:
            error = orjson.loads(body)
            message = error.get("error", {}).get("message") if isinstance(
                error.get("error"), dict) else error.get("message") or error.get("detail")
        except (orjson.JSONDecodeError, AttributeError):
            message = body[:500].decode(errors="replace")
        if 400 <= status < 500:
            return EngineRejected(f"vLLM rejected the request: {message}", engine_status=status)
        return EngineError(f"vLLM answered HTTP {status}: {message}")

    # -- generation --------------------------------------------------------------------
    async def generate(self, input_ids: TokenIds, params: SamplingParams, rid: str, *,
                       replay: ReplayRequest | None = None) -> GenerateResult:
        await self._models()
        start = time.perf_counter()
        self.prompt_json.begin()
        try:
            status, body = await self._call(
                "POST", "/v1/completions", self._payload(input_ids, params, rid, replay,
                                                         stream=False))
        finally:
            self.prompt_json.end()
        if status != 200:
            raise self._refusal(status, body)
        try:
            data = orjson.loads(body)
            choice = data["choices"][0]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise _protocol(f"no choice in the /v1/completions reply for {rid}") from exc
        ids = _token_ids(choice.get("token_ids"), rid)
        logprobs = _logprobs(choice.get("logprobs"), len(ids), rid)
        return self._result(ids, logprobs, choice, data.get("usage"), len(input_ids), start)

    async def generate_stream(self, input_ids: TokenIds, params: SamplingParams, rid: str,
                              *, replay: ReplayRequest | None = None
                              ) -> AsyncIterator[StreamChunk]:
        await self._models()
        start = time.perf_counter()
        payload = self._payload(input_ids, params, rid, replay, stream=True)
        ids: list[int] = []
        logprobs: list[float] = []
        finish: dict[str, Any] | None = None
        usage: dict[str, Any] | None = None
        self.prompt_json.begin()
        try:
            async with self.http.stream("/v1/completions", payload) as resp:
                if resp.status != 200:
                    raise self._refusal(resp.status, await resp.read())
                async for data in sse_data(resp.content):
                    if data == b"[DONE]":
                        continue
                    event = orjson.loads(data)
                    usage = event.get("usage") or usage
                    for choice in event.get("choices") or []:
                        new = _token_ids(choice.get("token_ids") or [], rid)
                        ids += new
                        logprobs += _logprobs(choice.get("logprobs"), len(new), rid)
                        if choice.get("finish_reason") is not None:
                            finish = choice
                        if new:
                            yield StreamChunk(ids)  # grown in place: no copy
        finally:
            self.prompt_json.end()
        if finish is None:
            raise _protocol(f"the stream of {rid} ended without a finish_reason")
        result = self._result(ids, logprobs, finish, usage, len(input_ids), start)
        yield StreamChunk(result.output_ids, result)

    def _result(self, ids: list[int], logprobs: list[float], choice: dict[str, Any],
                usage: dict[str, Any] | None, prompt_len: int, start: float
                ) -> GenerateResult:
        reason = choice.get("finish_reason")
        kind: FinishReason
        if reason == "length":
            kind = "length"
        elif reason == "abort":
            kind = "abort"
        elif reason == "stop":
            kind = "stop"
        else:
            raise _protocol(f"finish_reason {reason!r} is not stop, length or abort")
        matched = choice.get("stop_reason")
        if kind == "stop" and matched is None and ids:
            matched = ids[-1]  # EOS: the last id
        details = (usage or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        rows = choice.get("routed_experts")
        return GenerateResult(
            output_ids=ids, logprobs=logprobs, finish_reason=kind,
            matched_stop=matched if isinstance(matched, int | str) else None,
            prompt_tokens=int((usage or {}).get("prompt_tokens") or prompt_len),
            cached_tokens=int(cached or 0), weight_version=self.weight_version,
            routed_experts=None if rows is None else _npy_rows(rows),
            e2e_latency=time.perf_counter() - start,
            extra={"logprobs_mode": self.logprobs_mode})

    # -- control -----------------------------------------------------------------------
    async def abort(self, rid: str) -> None:
        status, _ = await self._call("POST", "/abort_requests", {"request_ids": [rid]})
        if status not in (200, 404, 405):  # no RL routes: closing the request aborts it
            raise EngineError(f"vLLM answered HTTP {status} to /abort_requests")

    async def context_length(self) -> int | None:
        await self._models()
        return self._max_model_len

    async def pause(self, mode: PauseMode = "retract") -> None:
        await self._control(f"/pause?mode={PAUSE_MODES[mode]}")

    async def resume(self) -> None:
        await self._control("/resume")

    async def update_weight_version(self, version: str) -> None:
        self.weight_version = version
        status, _ = await self._call("POST", "/update_weight_version",
                                     {"new_version": version})
        if status not in (200, 404, 405):
            raise EngineError(f"vLLM answered HTTP {status} to /update_weight_version")

    async def _control(self, path: str) -> None:
        status, body = await self._call("POST", path)
        if status in (404, 405):
            raise EngineError(f"this vLLM has no {path.split('?')[0]} route: start it with "
                              "VLLM_SERVER_DEV_MODE=1 to pause and resume it")
        if status != 200:
            raise self._refusal(status, body)

    async def health(self) -> bool:
        return await self.probe() is None

    async def probe(self) -> str | None:
        """None when ``GET /health`` answers 200 within :data:`PROBE_TIMEOUT_S` seconds
        (not the generation timeout), else a short reason."""
        return await self.http.probe("/health", PROBE_TIMEOUT_S)

    async def close(self) -> None:
        await self.http.close()


def _token_ids(value: Any, rid: str) -> list[int]:
    if not isinstance(value, list) or not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID
                                              for t in value):
        raise _protocol(f"token_ids of {rid} is not a list of token ids "
                        "(return_token_ids must be honoured)")
    return value


def _logprobs(value: Any, n: int, rid: str) -> list[float]:
    """The sampled tokens' logprobs of a completions ``logprobs`` object."""
    values = value.get("token_logprobs") if isinstance(value, dict) else None
    if not isinstance(values, list) or len(values) != n:
        raise _protocol(f"logprobs of {rid}: expected {n} token_logprobs (logprobs=0 must "
                        "be honoured)")
    out = []
    for i, lp in enumerate(values):
        if isinstance(lp, bool) or not isinstance(lp, int | float):
            raise _protocol(f"token_logprobs[{i}] of {rid} is {lp!r}, not a number")
        out.append(float(lp))
    return out


def _npy_rows(encoded: Any) -> bytes:
    """vLLM's routed experts (base64 of an ``.npy``) as raw little-endian int32 rows."""
    try:
        rows = np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)
    except (ValueError, TypeError, OSError) as exc:
        raise _protocol(f"routed_experts is not base64 .npy: {exc}") from exc
    return bytes(np.ascontiguousarray(rows.astype("<i4")).tobytes())
