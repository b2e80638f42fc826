"""SGLang client: native ``POST /generate`` with ``input_ids`` (design §8).

One sample per request with our own ``rid``; explicit sampling parameters (SGLang's
defaults differ from OpenAI's); ``output_ids`` are the truth and
``meta_info.output_token_logprobs`` (``[logprob, id, text|null]``) must agree with them.
The client keeps one pooled keep-alive aiohttp session; bodies are encoded with orjson
(numpy id arrays serialize without a Python list).
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

import aiohttp
import orjson

from tito.types.engine import FinishReason, GenerateResult, PauseMode, SamplingParams, TokenIds
from tito.types.errors import EngineError, EngineRejected, EngineTimeout

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


def _error_text(body: bytes, limit: int = 500) -> str:
    """The message of an engine's error body (SGLang's two 400 shapes, FastAPI's detail)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")[:limit]
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        err = err.get("message") or err.get("detail") or err
    return str(err)[:limit]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_INT = frozenset({int})
_NUMBER = frozenset({float, int})


def _well_formed_logprobs(lp: list[Any], output_ids: list[int]) -> list[float] | None:
    """The logprobs of ``lp`` when every entry is a well-formed ``[float, id(, text)]``
    for its output id (checked in C-level passes); None: check entry by entry."""
    if set(map(type, lp)) != {list} or not set(map(len, lp)) <= {2, 3}:
        return None
    tokens = [entry[1] for entry in lp]
    values = [entry[0] for entry in lp]
    if tokens != output_ids or not set(map(type, tokens)) <= _INT:
        return None
    kinds = set(map(type, values))
    if not kinds <= _NUMBER:
        return None
    return values if kinds == {float} else [float(v) for v in values]


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class _Reply:
    """Checks of one ``/generate`` reply; every failure is an :class:`EngineError` naming
    the field (an engine answering garbage is a bad gateway, not a bug of ours)."""

    def __init__(self, rid: str) -> None:
        self.rid = rid

    def error(self, problem: str) -> EngineError:
        return EngineError(f"engine reply for {self.rid}: {problem}")

    def meta(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or "meta_info" not in data:
            raise EngineError(f"engine reply for {self.rid} is not a /generate result object")
        meta = data["meta_info"]
        if not isinstance(meta, dict):
            raise self.error(f"meta_info is {_kind(meta)}, not an object")
        return meta

    def finish(self, meta: dict[str, Any]) -> tuple[FinishReason, int | str | None]:
        """The finish reason and matched stop; an abort with an error status raises."""
        finish = meta.get("finish_reason") or {}
        kind = finish.get("type") if isinstance(finish, dict) else None
        if kind not in ("stop", "length", "abort"):
            raise EngineError(
                f"engine reply for {self.rid} has an unknown finish_reason {finish!r}")
        if kind == "abort":
            self._check_abort_status(finish)
        matched = finish.get("matched") if kind == "stop" else None
        if matched is not None and not (_is_int(matched) or isinstance(matched, str)):
            raise self.error(f"meta_info.finish_reason.matched is {_kind(matched)}, "
                             "not a token id or a string")
        return kind, matched

    def _check_abort_status(self, finish: dict[str, Any]) -> None:
        status = finish.get("status_code")
        if status is None:
            return
        if not _is_int(status):
            raise self.error(f"meta_info.finish_reason.status_code is {_kind(status)}, "
                             "not an integer")
        if 400 <= status < 600:
            reason = f"engine aborted {self.rid}: {finish.get('message')}"
            if status >= 500:
                raise EngineError(reason, code="engine_rejected")
            raise EngineRejected(reason, engine_status=status)

    def output_ids(self, data: dict[str, Any]) -> list[int]:
        output_ids = data.get("output_ids")
        if not isinstance(output_ids, list):
            raise EngineError(f"engine reply for {self.rid} has no output_ids")
        if set(map(type, output_ids)) <= _INT:  # every turn: one C-level pass
            return output_ids
        for i, tok in enumerate(output_ids):
            if not _is_int(tok):
                raise self.error(f"output_ids[{i}] is {_kind(tok)} {tok!r}, not a token id")
        return output_ids

    def logprobs(self, meta: dict[str, Any], output_ids: list[int]) -> list[float]:
        lp = meta.get("output_token_logprobs")
        if not isinstance(lp, list):
            raise EngineError(
                f"engine reply for {self.rid} has no meta_info.output_token_logprobs "
                "(return_logprob must be honoured)"
            )
        if len(lp) != len(output_ids):
            raise self.error(f"{len(lp)} output_token_logprobs for {len(output_ids)} output_ids")
        fast = _well_formed_logprobs(lp, output_ids)
        if fast is not None:
            return fast
        return [self._logprob(i, entry, tid)
                for i, (entry, tid) in enumerate(zip(lp, output_ids, strict=True))]

    def _logprob(self, i: int, entry: Any, tid: int) -> float:
        """``[logprob, id]`` or ``[logprob, id, text]`` for output token ``tid``."""
        if not isinstance(entry, list) or not 2 <= len(entry) <= 3:
            raise self.error(f"meta_info.output_token_logprobs[{i}] is {entry!r}, not a "
                             "[logprob, id, text] list")
        value, token = entry[0], entry[1]
        if token != tid or not _is_int(token):
            raise self.error(f"logprob entry {i} is for token {token!r}, output_ids has {tid}")
        if value is None:
            return 0.0
        if not _is_number(value):
            raise self.error(f"meta_info.output_token_logprobs[{i}][0] is {_kind(value)}, "
                             "not a number")
        return float(value)

    def count(self, meta: dict[str, Any], key: str) -> int:
        value = meta.get(key)
        if value is None:
            return 0
        if not _is_int(value):
            raise self.error(f"meta_info.{key} is {_kind(value)} {value!r}, not an integer")
        return value

    def weight_version(self, meta: dict[str, Any]) -> str | None:
        value = meta.get("weight_version")
        if value is not None and not isinstance(value, str):
            raise self.error(f"meta_info.weight_version is {_kind(value)}, not a string")
        return value

    def e2e_latency(self, meta: dict[str, Any]) -> float | None:
        value = meta.get("e2e_latency")
        if value is None:
            return None
        if not _is_number(value):
            raise self.error(f"meta_info.e2e_latency is {_kind(value)}, not a number")
        return float(value)

    def routed_experts(self, meta: dict[str, Any]) -> bytes | None:
        routed = meta.get("routed_experts")
        if not isinstance(routed, str):
            return None
        try:
            return base64.b64decode(routed)
        except binascii.Error as exc:
            raise self.error(f"meta_info.routed_experts is not base64: {exc}") from exc


def parse_generate_response(data: Any, *, rid: str) -> GenerateResult:
    """Validate an SGLang ``/generate`` reply (n=1) and turn it into a GenerateResult.

    A malformed reply raises :class:`EngineError` naming the field; an abort with an
    engine error status raises :class:`EngineRejected` (4xx) or an ``engine_rejected``
    :class:`EngineError` (5xx).
    """
    reply = _Reply(rid)
    meta = reply.meta(data)
    kind, matched = reply.finish(meta)
    output_ids = reply.output_ids(data)
    return GenerateResult(
        output_ids=output_ids,
        logprobs=reply.logprobs(meta, output_ids),
        finish_reason=kind,
        matched_stop=matched,
        prompt_tokens=reply.count(meta, "prompt_tokens"),
        cached_tokens=reply.count(meta, "cached_tokens"),
        weight_version=reply.weight_version(meta),
        routed_experts=reply.routed_experts(meta),
        e2e_latency=reply.e2e_latency(meta),
    )


def _max_model_len(models: Any) -> int | None:
    """The smallest ``max_model_len`` of a ``/v1/models`` reply (None: none is given)."""
    cards = models.get("data") if isinstance(models, dict) else None
    if not isinstance(cards, list):
        return None
    lengths = [c["max_model_len"] for c in cards
               if isinstance(c, dict) and _is_int(c.get("max_model_len"))]
    return min(lengths) if lengths else None


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
        input_ids: TokenIds,
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
                raise EngineRejected(f"engine rejected the request: {message}",
                                     engine_status=status)
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
                        self._context_length = _max_model_len(orjson.loads(await resp.read()))
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
