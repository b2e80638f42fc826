"""SGLang client: native ``POST /generate`` with ``input_ids`` (design §8).

One sample per request with our own ``rid``; explicit sampling parameters (SGLang's
defaults differ from OpenAI's); ``output_ids`` are the truth and
``meta_info.output_token_logprobs`` (``[logprob, id, text|null]``) must agree with them.
The client keeps one pooled keep-alive aiohttp session; bodies are encoded with orjson
(numpy id arrays serialize without a Python list), and a session's ``input_ids`` text is
built on its previous prompt's (:mod:`tito.engines.prompt_json`: O(new ids) a turn).

Errors: a transport failure or an engine 5xx is an :class:`EngineError` (code
``engine_error``); a reply we cannot use (not JSON, a field of the wrong type or out of
range) an :class:`EngineError` with code ``engine_protocol_error``; a timeout an
:class:`EngineTimeout`; an engine 4xx an :class:`EngineRejected` with the engine's status.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import errno
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import orjson
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from tito.engines.prompt_json import PromptJson, prompt_key
from tito.types.engine import (
    LOGPROB_TOLERANCE,
    CheckedOutput,
    FinishReason,
    GenerateResult,
    PauseMode,
    ReplayRequest,
    SamplingParams,
    StreamChunk,
    TokenIds,
    WeightSpan,
    compact_logprobs,
)
from tito.types.errors import EngineError, EngineRejected, EngineTimeout, EngineUnreachable
from tito.types.placement import session_of
from tito.types.records import IDS_DTYPE

_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY
_JSON_HEADERS = {"content-type": "application/json"}

PROTOCOL_ERROR = "engine_protocol_error"
"""``code`` of an :class:`EngineError` raised because the engine's reply is malformed."""
CONTEXT_RETRY_S = 5.0
"""After a failed or unusable ``/v1/models`` answer, ask again at most this often."""
PROBE_TIMEOUT_S = 2.0
"""``GET /health`` must answer 200 within this (:meth:`SGLangEngine.probe`)."""
MODELS_TIMEOUT_S = 10.0


def protocol_error(message: str) -> EngineError:
    """An :class:`EngineError` for a reply we cannot use (code ``engine_protocol_error``)."""
    return EngineError(message, code=PROTOCOL_ERROR)


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
    """The logprobs of ``lp`` when every entry is a well-formed ``[logprob, id(, text)]``
    for its output id with a finite logprob <= 0 (up to :data:`LOGPROB_TOLERANCE` of
    rounding; checked in C-level passes); None: check
    entry by entry."""
    try:  # an entry that is not a list fails one of these, or the comparison below
        if not set(map(len, lp)) <= {2, 3}:
            return None
        tokens = [entry[1] for entry in lp]
        values = [entry[0] for entry in lp]
    except (TypeError, KeyError, IndexError):
        return None
    if tokens != output_ids or not set(map(type, tokens)) <= _INT:
        return None
    kinds = set(map(type, values))
    if not kinds <= _NUMBER:
        return None
    if kinds != {float}:
        try:
            values = [float(v) for v in values]
        except OverflowError:
            return None
    # max > 0 catches positives and +inf; a NaN or -inf makes the sum non-finite (so
    # can an overflowing sum of huge finite values: the entry-by-entry check decides)
    if values and not (max(values) <= LOGPROB_TOLERANCE and math.isfinite(sum(values))):
        return None
    return values


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class _Reply:
    """Checks of one ``/generate`` reply; every failure is an ``engine_protocol_error``
    :class:`EngineError` naming the field (an engine answering garbage is a bad gateway,
    not a bug of ours)."""

    def __init__(self, rid: str, vocab_size: int | None = None) -> None:
        self.rid = rid
        self.vocab_size = vocab_size

    def error(self, problem: str) -> EngineError:
        return protocol_error(f"engine reply for {self.rid}: {problem}")

    def meta(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or "meta_info" not in data:
            raise protocol_error(f"engine reply for {self.rid} is not a /generate result object")
        meta = data["meta_info"]
        if not isinstance(meta, dict):
            raise self.error(f"meta_info is {_kind(meta)}, not an object")
        return meta

    def finish(self, meta: dict[str, Any]) -> tuple[FinishReason, int | str | None]:
        """The finish reason and matched stop; an abort with an error status raises."""
        finish = meta.get("finish_reason") or {}
        kind = finish.get("type") if isinstance(finish, dict) else None
        if kind not in ("stop", "length", "abort"):
            raise protocol_error(
                f"engine reply for {self.rid} has an unknown finish_reason {finish!r}")
        if kind == "abort":
            self._check_abort_status(finish)
        matched = finish.get("matched") if kind == "stop" else None
        if matched is not None and not (_is_int(matched) or isinstance(matched, str)):
            raise self.error(f"meta_info.finish_reason.matched is {_kind(matched)}, "
                             "not a token id or a string")
        return kind, matched

    @staticmethod
    def finish_message(meta: dict[str, Any]) -> str | None:
        finish = meta.get("finish_reason")
        message = finish.get("message") if isinstance(finish, dict) else None
        return message if isinstance(message, str) else None

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
            raise protocol_error(f"engine reply for {self.rid} has no output_ids")
        # every turn: C-level passes (types, then range)
        if set(map(type, output_ids)) <= _INT and self._in_range(output_ids):
            return output_ids
        for i, tok in enumerate(output_ids):
            self._check_id(i, tok)
        return output_ids

    def _in_range(self, ids: list[int]) -> bool:
        if not ids:
            return True
        vocab = self.vocab_size
        return min(ids) >= 0 and (vocab is None or max(ids) < vocab)

    def _check_id(self, i: int, tok: Any) -> None:
        if not _is_int(tok):
            raise self.error(f"output_ids[{i}] is {_kind(tok)} {tok!r}, not a token id")
        if tok < 0:
            raise self.error(f"output_ids[{i}] is {tok}, a negative token id")
        if self.vocab_size is not None and tok >= self.vocab_size:
            raise self.error(f"output_ids[{i}] is {tok}, outside the vocabulary "
                             f"({self.vocab_size} ids)")

    def logprobs(self, meta: dict[str, Any], output_ids: list[int]) -> list[float]:
        lp = meta.get("output_token_logprobs")
        if not isinstance(lp, list):
            raise protocol_error(
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
        """``[logprob, id]`` or ``[logprob, id, text]`` for output token ``tid``: a finite
        logprob <= 0, up to :data:`LOGPROB_TOLERANCE` of rounding in the engine's
        log-softmax (orjson, SGLang's encoder, writes NaN and infinities as null)."""
        if not isinstance(entry, list) or not 2 <= len(entry) <= 3:
            raise self.error(f"meta_info.output_token_logprobs[{i}] is {entry!r}, not a "
                             "[logprob, id, text] list")
        value, token = entry[0], entry[1]
        if token != tid or not _is_int(token):
            raise self.error(f"logprob entry {i} is for token {token!r}, output_ids has {tid}")
        if not _is_number(value):
            raise self.error(f"meta_info.output_token_logprobs[{i}][0] is {_kind(value)}, "
                             "not a number")
        try:
            logprob = float(value)
        except OverflowError:
            logprob = math.inf
        if not math.isfinite(logprob) or logprob > LOGPROB_TOLERANCE:
            raise self.error(f"meta_info.output_token_logprobs[{i}][0] is {value!r}, not a "
                             "log-probability (finite and <= 0)")
        return logprob

    def count(self, meta: dict[str, Any], key: str) -> int:
        value = meta.get(key)
        if value is None:
            return 0
        if not _is_int(value) or value < 0:
            raise self.error(f"meta_info.{key} is {_kind(value)} {value!r}, not a count")
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

    def rows(self, meta: dict[str, Any], key: str) -> bytes | None:
        """A base64 replay payload (``routed_experts``, ``indexer_topk``) as raw bytes."""
        payload = meta.get(key)
        if payload is None:
            return None
        if not isinstance(payload, str):
            raise self.error(f"meta_info.{key} is {_kind(payload)}, not a base64 string")
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise self.error(f"meta_info.{key} is not base64: {exc}") from exc

    def weight_versions(self, meta: dict[str, Any]) -> list[WeightSpan] | None:
        """``meta_info.weight_versions``: ``[{"version", "start", "end"}]`` over output
        indices, present only when the weights changed while the request ran."""
        spans = meta.get("weight_versions")
        if spans is None:
            return None
        if not isinstance(spans, list):
            raise self.error(f"meta_info.weight_versions is {_kind(spans)}, not a list")
        out: list[WeightSpan] = []
        for i, span in enumerate(spans):
            if not (isinstance(span, dict) and isinstance(span.get("version"), str)
                    and _is_int(span.get("start")) and _is_int(span.get("end"))
                    and 0 <= span["start"] <= span["end"]):
                raise self.error(f"meta_info.weight_versions[{i}] is {span!r}, not "
                                 "{version: str, start: int, end: int}")
            out.append(WeightSpan(span["version"], span["start"], span["end"]))
        return out

    def optional_count(self, meta: dict[str, Any], key: str) -> int | None:
        return None if meta.get(key) is None else self.count(meta, key)


def parse_generate_response(data: Any, *, rid: str,
                            vocab_size: int | None = None) -> GenerateResult:
    """Validate an SGLang ``/generate`` reply (n=1) and turn it into a GenerateResult.

    A malformed reply raises an ``engine_protocol_error`` :class:`EngineError` naming the
    field: ids must be >= 0 (and < ``vocab_size`` when given), logprobs finite and <= 0
    (up to :data:`LOGPROB_TOLERANCE`, the gateway's own check, ``check_output``).
    An abort with an engine error status raises :class:`EngineRejected` (4xx) or an
    ``engine_rejected`` :class:`EngineError` (5xx).
    """
    reply = _Reply(rid, vocab_size)
    meta = reply.meta(data)
    kind, matched = reply.finish(meta)
    output_ids = reply.output_ids(data)
    logprobs = reply.logprobs(meta, output_ids)
    return GenerateResult(
        output_ids=output_ids,
        logprobs=logprobs,
        finish_reason=kind,
        matched_stop=matched,
        prompt_tokens=reply.count(meta, "prompt_tokens"),
        cached_tokens=reply.count(meta, "cached_tokens"),
        weight_version=reply.weight_version(meta),
        weight_versions=reply.weight_versions(meta),
        routed_experts=reply.rows(meta, "routed_experts"),
        indexer_topk=reply.rows(meta, "indexer_topk"),
        indexer_topk_num_layers=reply.optional_count(meta, "indexer_topk_num_layers"),
        e2e_latency=reply.e2e_latency(meta),
        finish_message=reply.finish_message(meta),
        checked=CheckedOutput(np.array(output_ids, dtype=IDS_DTYPE),
                              compact_logprobs(logprobs)),
    )


def _max_model_len(models: Any) -> int | None:
    """The smallest positive ``max_model_len`` of a ``/v1/models`` reply (None: none)."""
    cards = models.get("data") if isinstance(models, dict) else None
    if not isinstance(cards, list):
        return None
    lengths = [c["max_model_len"] for c in cards
               if isinstance(c, dict) and _is_int(c.get("max_model_len"))
               and c["max_model_len"] > 0]
    return min(lengths) if lengths else None


# -- the stale keep-alive retry --------------------------------------------------------
_STALE_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE})
_WRITE_FAILED = "Can not write request body"


def closed_before_reply(exc: BaseException) -> bool:
    """Whether ``exc`` shows the server closed the connection before any byte of a
    response arrived; exactly these:

    - :class:`aiohttp.ServerDisconnectedError` without a partial response (aiohttp passes
      the partly parsed response instead of its default text when some of it came);
    - ``ConnectionResetError`` / ``BrokenPipeError``: aiohttp's "Cannot write to closing
      transport" (:class:`aiohttp.ClientConnectionResetError`; a bare
      ``ConnectionResetError`` before aiohttp 3.10), raised while writing the request;
    - :class:`aiohttp.ClientOSError` with errno ``ECONNRESET`` or ``EPIPE``, and aiohttp's
      "Can not write request body" with one of those errnos or with none (a wrapped
      "Cannot write to closing transport").

    Never a timeout (aiohttp's ServerTimeoutError is a connection error too)."""
    if isinstance(exc, TimeoutError):
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return isinstance(exc.message, str)
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return True
    if isinstance(exc, aiohttp.ClientOSError):
        if exc.errno in _STALE_ERRNOS:
            return True
        return exc.errno is None and str(exc.strerror).startswith(_WRITE_FAILED)
    return False


class _Attempt:
    """One exchange on the pooled session: was its connection reused, did a reply start."""

    __slots__ = ("answered", "reused")

    def __init__(self) -> None:
        self.reused = False
        self.answered = False


_ATTEMPT: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar(
    "tito_sglang_attempt", default=None)


def routing_headers(rid: str) -> dict[str, str]:
    """A ``/generate`` request's headers: JSON, and the session as the routing key of
    SGLang's router (``X-SMG-Routing-Key``, its consistent-hashing policy), so that one
    ``--engine-url`` pointing at the router keeps each session on one engine."""
    return {**_JSON_HEADERS, "x-smg-routing-key": session_of(rid)}


async def _sse_data(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The ``data:`` payloads of a server-sent event stream."""
    async for line in content:
        line = line.strip()
        if line.startswith(b"data:"):
            yield line[5:].strip()


def _stream_event(data: bytes, rid: str, seen: int) -> tuple[dict[str, Any], list[Any]]:
    """One cumulative stream chunk: (the event, its output ids so far)."""
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise protocol_error(f"stream event for {rid} is not JSON: {exc}") from exc
    if not isinstance(event, dict):
        raise protocol_error(f"stream event for {rid} is not an object")
    if "error" in event:
        raise EngineError(f"engine stream error: {_error_text(data)}")
    ids = event.get("output_ids")
    if not isinstance(ids, list) or len(ids) < seen:
        raise protocol_error(f"stream chunk for {rid}: output_ids must grow cumulatively "
                             "(run SGLang without --incremental-streaming-output)")
    return event, ids


class _PoolConnector(aiohttp.TCPConnector):
    """A TCPConnector that tells the running :class:`_Attempt` whether the connection it
    hands out was handed out before (a pooled keep-alive connection). Cheaper than an
    aiohttp TraceConfig, which costs ~20 us per request even with one listener."""

    async def connect(self, req: ClientRequest, traces: list[Trace],
                      timeout: aiohttp.ClientTimeout) -> Connection:
        conn = await super().connect(req, traces, timeout)
        attempt = _ATTEMPT.get()
        proto = conn.protocol
        if attempt is not None and proto is not None:
            # a mark on the connection's protocol object (it has a __dict__): cheaper
            # than a WeakSet of the handed-out ones, and it goes with the connection
            attempt.reused = getattr(proto, "_tito_handed_out", False)
            proto._tito_handed_out = True  # type: ignore[attr-defined]
        return conn


class SGLangEngine:
    """An SGLang server (or anything speaking its native ``/generate``).

    **Keep-alive.** One pooled aiohttp session; an idle pooled connection is dropped after
    ``keepalive_timeout`` seconds, which must be shorter than the engine's own (uvicorn,
    SGLang's HTTP server, closes idle connections after 5 s). A request written on a
    connection the server has just closed fails ("Server disconnected"), which would be a
    spurious 502.

    **One safe retry.** A request is sent again, once, on a fresh (unpooled) connection
    when all of these hold: its connection was *reused* from the pool; the failure came
    before the response's status line and headers were parsed; and it is one of the
    errors :func:`closed_before_reply` accepts: :class:`aiohttp.ServerDisconnectedError`
    without a partial response, a ``ConnectionResetError``/``BrokenPipeError`` raised
    while writing the request (aiohttp's "Cannot write to closing transport"), or
    :class:`aiohttp.ClientOSError` with ``ECONNRESET``/``EPIPE`` (including "Can not write
    request body"). Each retry adds one to :attr:`stale_retries`. This is safe because
    such a failure means the engine never ran the request: an idle-closed keep-alive
    connection never received it (the server closed its end first, so our bytes met a
    closed socket), and the engine's HTTP server closes a connection without answering
    only when no request is in progress on it (keep-alive timeout, shutdown); SGLang does
    not start a request whose body it did not fully read; an engine that crashed after
    reading it is gone and cannot run the retry. (A server that reads a request on a
    pooled connection and then closes or resets it without a byte of response looks the
    same on the wire and would get it twice; SGLang's uvicorn does not do that, the mock's
    ``reset`` fault does.) Never retried: a timeout (the engine may be running the
    request), a failure after the response started (headers received, body cut), a
    failure on a fresh connection, a refused connection, any other error.
    Transport failures are :class:`EngineError` (``engine_error``, cause chained),
    timeouts :class:`EngineTimeout`.

    ``vocab_size``: when given, an output id >= it is a protocol error.
    """

    name = "sglang"

    def __init__(self, url: str, *, timeout: float = 600.0, max_connections: int = 1024,
                 keepalive_timeout: float = 4.0, vocab_size: int | None = None,
                 lora_path: str | None = None, stream_interval: int = 1):
        self.url = url.rstrip("/")
        self.stream_interval = stream_interval
        """Ids per stream chunk of a streamed turn (SGLang ``stream_interval``)."""
        self.lora_path = lora_path
        """LoRA adapter name sent as ``lora_path`` on every request (``--lora-name``)."""
        self.timeout = timeout
        self.max_connections = max_connections
        self.keepalive_timeout = keepalive_timeout
        self.vocab_size = vocab_size
        self.stale_retries = 0
        """Requests sent again on a fresh connection after a stale pooled one failed."""
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._context_length: int | None = None
        self._context_retry_at = 0.0
        self._context_lock = asyncio.Lock()
        self.prompt_json = PromptJson()
        """Each session's previous prompt text: a turn serializes only its new ids."""

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = _PoolConnector(limit=self.max_connections,
                                       keepalive_timeout=self.keepalive_timeout)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                json_serialize=lambda o: orjson.dumps(o, option=_JSON_OPTS).decode(),
            )
        return self._session

    # -- transport ---------------------------------------------------------------------
    @staticmethod
    async def _exchange(session: aiohttp.ClientSession, method: str, url: str,
                        body: bytes | None, timeout: aiohttp.ClientTimeout,
                        attempt: _Attempt | None, headers: dict[str, str] | None = None
                        ) -> tuple[int, bytes]:
        if headers is None:
            headers = _JSON_HEADERS if body is not None else None
        token = _ATTEMPT.set(attempt)
        try:
            async with session.request(method, url, data=body, headers=headers,
                                       timeout=timeout) as resp:
                if attempt is not None:
                    attempt.answered = True
                return resp.status, await resp.read()
        finally:
            _ATTEMPT.reset(token)

    async def _request(self, method: str, path: str, body: bytes | None = None, *,
                       timeout: aiohttp.ClientTimeout | None = None,
                       headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(status, body) of one request; see the class docstring for the retry."""
        timeout = timeout or self._timeout
        attempt = _Attempt()
        try:
            return await self._exchange(self._client(), method, self.url + path, body,
                                        timeout, attempt, headers)
        except TimeoutError as exc:
            raise self._timed_out(path, timeout) from exc
        except (aiohttp.ClientError, OSError) as exc:
            if not (attempt.reused and not attempt.answered and closed_before_reply(exc)):
                raise self._transport_error(path, exc) from exc
            first = f"{type(exc).__name__}: {exc}"
        self.stale_retries += 1
        return await self._retry_fresh(method, path, body, timeout, first, headers)

    async def _retry_fresh(self, method: str, path: str, body: bytes | None,
                           timeout: aiohttp.ClientTimeout, first: str,
                           headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """The request again on a new connection of its own (closed afterwards)."""
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as fresh:
            try:
                return await self._exchange(fresh, method, self.url + path, body, timeout,
                                            None, headers)
            except TimeoutError as exc:
                raise self._timed_out(path, timeout) from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise self._transport_error(
                    path, exc, note=f" (retried on a fresh connection after {first})") from exc

    def _timed_out(self, path: str, timeout: aiohttp.ClientTimeout) -> EngineTimeout:
        return EngineTimeout(f"engine {self.url}{path} timed out after {timeout.total}s")

    def _transport_error(self, path: str, exc: BaseException, note: str = "") -> EngineError:
        return EngineUnreachable(f"engine transport error on {self.url}{path}: "
                                 f"{type(exc).__name__}: {exc}{note}")

    async def _post(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        return await self._request("POST", path, orjson.dumps(payload, option=_JSON_OPTS))

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
        # {"input_ids": [...], "rid": ...}: the ids' text spliced in (O(new ids) a turn)
        return self.prompt_json.payload(prompt_key(rid), input_ids, b'{"input_ids":',
                                        b"," + orjson.dumps(payload, option=_JSON_OPTS)[1:])

    @staticmethod
    def _refusal(status: int, body: bytes) -> EngineError:
        message = _error_text(body)
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
        """``/generate`` with ``stream: true`` (``stream_interval`` ids per chunk). SGLang's
        default streaming is cumulative (each chunk holds every id so far; not
        ``--incremental-streaming-output``): a chunk that does not extend the previous one
        is an ``engine_protocol_error``. The final chunk (a ``finish_reason``) is checked
        as a whole reply. Not retried: a stream is not resent."""
        start = time.perf_counter()
        body = self._generate_payload(input_ids, params, rid, replay, stream=True)
        path = "/generate"
        self.prompt_json.begin()
        try:
            async with self._client().post(self.url + path, data=body,
                                           headers=routing_headers(rid),
                                           timeout=self._timeout) as resp:
                if resp.status != 200:
                    raise self._refusal(resp.status, await resp.read())
                seen = 0
                async for data in _sse_data(resp.content):
                    if data == b"[DONE]":
                        break
                    event, ids = _stream_event(data, rid, seen)
                    seen = len(ids)
                    meta = event.get("meta_info")
                    if isinstance(meta, dict) and meta.get("finish_reason") is not None:
                        result = parse_generate_response(event, rid=rid,
                                                         vocab_size=self.vocab_size)
                        if result.e2e_latency is None:
                            result.e2e_latency = time.perf_counter() - start
                        yield StreamChunk(result.output_ids, result)
                        return
                    yield StreamChunk(ids)
        except TimeoutError as exc:
            raise self._timed_out(path, self._timeout) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise self._transport_error(path, exc) from exc
        finally:
            self.prompt_json.end()
        raise protocol_error(f"the stream of {rid} ended without a finish_reason")

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
        timeout = aiohttp.ClientTimeout(total=min(self.timeout, MODELS_TIMEOUT_S))
        try:
            status, body = await self._request("GET", "/v1/models", timeout=timeout)
            return _max_model_len(orjson.loads(body)) if status == 200 else None
        except (EngineError, orjson.JSONDecodeError):
            return None

    async def probe(self) -> str | None:
        """None when ``GET /health`` answers 200 within :data:`PROBE_TIMEOUT_S` seconds,
        else a short reason."""
        try:
            status, body = await self._request(
                "GET", "/health", timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S))
        except EngineTimeout:
            return f"no answer from {self.url}/health within {PROBE_TIMEOUT_S:g}s"
        except EngineError as exc:
            cause = exc.__cause__
            return f"{type(cause).__name__}: {cause}"[:300] if cause else str(exc)[:300]
        if status != 200:
            return f"{self.url}/health answered HTTP {status} {_error_text(body, 200)}".rstrip()
        return None

    async def health(self) -> bool:
        return await self.probe() is None

    # -- control -----------------------------------------------------------------------
    async def abort(self, rid: str) -> None:
        await self._post("/abort_request", {"rid": rid})

    async def _control(self, path: str, payload: dict[str, Any]) -> None:
        """A control call; an engine that refuses it raises (its status kept)."""
        status, body = await self._post(path, payload)
        if 400 <= status < 500:
            raise EngineRejected(f"engine refused {path}: {_error_text(body)}",
                                 engine_status=status)
        if status >= 300:
            raise EngineError(f"engine answered HTTP {status} to {path}: {_error_text(body)}")

    async def pause(self, mode: PauseMode = "retract") -> None:
        await self._control("/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        await self._control("/continue_generation", {})

    async def update_weight_version(self, version: str) -> None:
        await self._control("/update_weight_version", {"new_version": version})

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
