"""SGLang client: native ``POST /generate`` with ``input_ids`` (DESIGN 8).

One sample per request with our own ``rid``; explicit sampling parameters (SGLang's
defaults differ from OpenAI's); ``output_ids`` are the truth and
``meta_info.output_token_logprobs`` (``[logprob, id, text|null]``) must agree with them.
The client keeps one pooled keep-alive aiohttp session; bodies are encoded with orjson
(numpy id arrays serialize without a Python list).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import numpy as np
import orjson

from tito.engines.base import GenerateResult, PauseMode, SamplingParams
from tito.errors import EngineError, EngineRejected, EngineTimeout

_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY


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
    return out


def _error_text(body: bytes) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")[:500]
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)
    return str(err)


def parse_generate_response(data: Any, *, rid: str) -> GenerateResult:
    """Validate an SGLang ``/generate`` reply (n=1) and turn it into a GenerateResult."""
    if not isinstance(data, dict) or "meta_info" not in data:
        raise EngineError(f"engine reply for {rid} is not a /generate result object")
    meta = data["meta_info"]
    output_ids = data.get("output_ids")
    if not isinstance(output_ids, list):
        raise EngineError(f"engine reply for {rid} has no output_ids")
    lp = meta.get("output_token_logprobs")
    if not isinstance(lp, list):
        raise EngineError(
            f"engine reply for {rid} has no meta_info.output_token_logprobs "
            "(return_logprob must be honoured)"
        )
    if len(lp) != len(output_ids):
        raise EngineError(
            f"engine reply for {rid}: {len(lp)} output_token_logprobs for "
            f"{len(output_ids)} output_ids"
        )
    logprobs: list[float] = []
    for i, (entry, tid) in enumerate(zip(lp, output_ids, strict=True)):
        if entry[1] != tid:
            raise EngineError(
                f"engine reply for {rid}: logprob entry {i} is for token {entry[1]}, "
                f"output_ids has {tid}"
            )
        logprobs.append(float(entry[0]) if entry[0] is not None else 0.0)
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind not in ("stop", "length", "abort"):
        raise EngineError(f"engine reply for {rid} has an unknown finish_reason {finish!r}")
    if kind == "abort" and finish.get("status_code") and 400 <= finish["status_code"] < 600:
        raise EngineRejected(f"engine aborted {rid}: {finish.get('message')}",
                             status=502 if finish["status_code"] >= 500 else 400)
    routed = meta.get("routed_experts")
    return GenerateResult(
        output_ids=[int(t) for t in output_ids],
        logprobs=logprobs,
        finish_reason=kind,
        matched_stop=finish.get("matched") if kind == "stop" else None,
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        cached_tokens=int(meta.get("cached_tokens") or 0),
        weight_version=meta.get("weight_version"),
        routed_experts=base64.b64decode(routed) if isinstance(routed, str) else None,
        e2e_latency=meta.get("e2e_latency"),
    )


class SGLangEngine:
    """An SGLang server (or anything speaking its native ``/generate``)."""

    name = "sglang"

    def __init__(self, url: str, *, timeout: float = 600.0, max_connections: int = 1024):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._context_length: int | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, keepalive_timeout=600)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                json_serialize=lambda o: orjson.dumps(o, option=_JSON_OPTS).decode(),
            )
        return self._session

    async def _post(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        body = orjson.dumps(payload, option=_JSON_OPTS)
        try:
            async with self._client().post(
                self.url + path, data=body, headers={"content-type": "application/json"}
            ) as resp:
                return resp.status, await resp.read()
        except TimeoutError as exc:
            raise EngineTimeout(f"engine {self.url}{path} timed out after {self.timeout}s") \
                from exc
        except aiohttp.ClientError as exc:
            raise EngineError(
                f"engine transport error on {self.url}{path}: {type(exc).__name__}: {exc}"
            ) from exc

    async def generate(
        self,
        input_ids: Sequence[int] | np.ndarray,
        params: SamplingParams,
        rid: str,
        *,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
    ) -> GenerateResult:
        payload: dict[str, Any] = {
            "input_ids": input_ids,
            "rid": rid,
            "sampling_params": sampling_payload(params),
            "return_logprob": True,
            "logprob_start_len": -1,
            "stream": False,
        }
        if return_routed_experts:
            payload["return_routed_experts"] = True
            payload["routed_experts_start_len"] = routed_experts_start_len
        start = time.perf_counter()
        status, body = await self._post("/generate", payload)
        if status != 200:
            message = _error_text(body)
            if 400 <= status < 500:
                raise EngineRejected(f"engine rejected the request: {message}", status=status)
            raise EngineError(f"engine answered HTTP {status}: {message}")
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise EngineError(f"engine reply for {rid} is not JSON: {exc}") from exc
        result = parse_generate_response(data, rid=rid)
        if result.e2e_latency is None:
            result.e2e_latency = time.perf_counter() - start
        return result

    async def context_length(self) -> int | None:
        """The engine's ``max_model_len`` from ``GET /v1/models`` (cached; None if unknown)."""
        if self._context_length is None:
            try:
                async with self._client().get(self.url + "/v1/models") as resp:
                    if resp.status == 200:
                        cards = orjson.loads(await resp.read()).get("data") or []
                        lengths = [c.get("max_model_len") for c in cards
                                   if isinstance(c.get("max_model_len"), int)]
                        self._context_length = min(lengths) if lengths else None
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
                return None
        return self._context_length

    async def abort(self, rid: str) -> None:
        await self._post("/abort_request", {"rid": rid})

    async def pause(self, mode: PauseMode = "retract") -> None:
        await self._post("/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        await self._post("/continue_generation", {})

    async def health(self) -> bool:
        try:
            async with self._client().get(self.url + "/health") as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
