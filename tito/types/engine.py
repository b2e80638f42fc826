"""The engine contract: token ids in, token ids (and their logprobs) out (design §8).

Every engine (SGLang, vLLM, the embedded CPU engine, the mock) implements :class:`Engine`.
The gateway never sends text to an engine and never trusts engine text: ``output_ids``
are the truth.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from tito.types.errors import EngineError
from tito.types.records import IDS_DTYPE, LOGPROB_DTYPE

FinishReason = Literal["stop", "length", "abort"]
PauseMode = Literal["retract", "abort", "in_place"]
TokenIds = Sequence[int] | np.ndarray
"""Token ids as a list or an int32/int64 numpy array (the gateway sends arrays)."""


@dataclass(frozen=True, slots=True)
class WeightSpan:
    """Output tokens ``[start, end)`` of one generation came from weights ``version``."""

    version: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class SamplingMask:
    """Kept token sets of consecutive generated positions: position ``i`` kept
    ``ids[offsets[i]:offsets[i + 1]]`` (top-k / top-p / min-p survivors)."""

    ids: np.ndarray
    """int32, every position's kept ids, concatenated."""
    offsets: np.ndarray
    """int64, ``positions + 1`` entries, from 0, non-decreasing, ending at ``len(ids)``."""

    @property
    def positions(self) -> int:
        return len(self.offsets) - 1


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """What a generation must also return for routing/indexer replay (design §8)."""

    routed_experts: bool = False
    indexer_topk: bool = False
    sampling_mask: bool = False
    """Ask for the kept token set of every generated position (SGLang
    ``return_sampling_mask``; sampling-mask replay)."""
    start_len: int = 0
    """First position whose rows are returned (incremental replay: the stored prefix's
    rows are not sent again); 0: every position of prompt + output."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Explicit sampling settings, always sent in full (engines' defaults differ)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    json_schema: str | None = None
    """A JSON schema (as JSON text) the completion must follow (structured output), or
    None. Engines that constrain decoding pass it on (SGLang ``json_schema``, vLLM
    ``structured_outputs.json``); one that cannot says so with a false
    ``enforces_json_schema`` attribute, and the turn is noted instead."""


@dataclass(slots=True)
class GenerateResult:
    """What one generation produced. ``logprobs[i]`` belongs to ``output_ids[i]``."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    matched_stop: int | str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    weight_version: str | None = None
    weight_versions: list[WeightSpan] | None = None
    """Spans of output-token indices per weight version, when the weights changed while
    the request ran (SGLang ``meta_info.weight_versions``); None: all of ``weight_version``."""
    routed_experts: bytes | None = None
    """Raw little-endian int32 routing rows (MoE routing replay), decoded from base64."""
    indexer_topk: bytes | None = None
    """Raw little-endian int32 indexer top-k rows (sparse-attention indexer replay)."""
    indexer_topk_num_layers: int | None = None
    sampling_mask: SamplingMask | None = None
    """The kept token set of each output id (sampling-mask replay), as the engine sent
    it; its length is checked against the output by the gateway."""
    e2e_latency: float | None = None
    spec_info: dict[str, int | float] | None = None
    """The engine's speculative-decoding counters of this request (SGLang's ``spec_*``
    keys of ``meta_info``, e.g. ``spec_verify_ct``, ``spec_num_correct_drafts``), as it
    sent them; None when it sent none (speculative decoding off)."""
    finish_message: str | None = None
    """Why the engine aborted the request (``finish_reason`` ``abort``), when it says."""
    extra: dict[str, object] = field(default_factory=dict)
    checked: CheckedOutput | None = None
    """Set by an engine client that already checked ``output_ids`` (integers >= 0) and
    ``logprobs`` (finite, <= 0) while parsing the reply: :func:`check_output` then only
    checks the vocabulary bound instead of walking both lists again."""

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.logprobs):
            raise EngineError(
                f"engine returned {len(self.output_ids)} output ids but "
                f"{len(self.logprobs)} logprobs"
            )


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One step of a streamed generation: the output ids generated so far (cumulative)
    and, on the last chunk only, the whole result.

    ``output_ids`` may be the engine client's own list, grown in place by the chunks that
    follow: read it before asking for the next chunk, never keep it (an engine that
    copied all ids so far into every chunk would make a long stream quadratic)."""

    output_ids: Sequence[int]
    result: GenerateResult | None = None


@dataclass(frozen=True, slots=True)
class MemberStats:
    """One engine of a pool (``--engine-url`` given several times): ``/health`` shows its
    URL, up, in flight and sessions; ``/metrics`` every figure (:meth:`figures`)."""

    url: str
    up: bool
    inflight: int
    sessions: int
    """Sessions placed on it."""
    requests: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def figures(self) -> dict[str, float]:
        """The ``tito_engine_<name>{engine="URL"}`` series of ``/metrics`` (a ``_total``
        name is a counter), with the prefix-cache hit rate."""
        return {"up": float(self.up), "inflight": self.inflight, "sessions": self.sessions,
                "requests_total": self.requests, "failures_total": self.failures,
                "prompt_tokens_total": self.prompt_tokens,
                "cached_tokens_total": self.cached_tokens,
                "cache_hit_rate": self.cached_tokens / self.prompt_tokens
                if self.prompt_tokens else 0.0}


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What an engine reports about itself (:meth:`Engine.stats`; ``/health``, ``/metrics``)."""

    name: str
    url: str | None = None
    """Where it is reached; None in process (the embedded engine). A pool: its first
    member's URL (every member is in :attr:`members`)."""
    stale_retries: int = 0
    """Requests resent once after the engine closed an idle pooled connection (a pool:
    the sum over its members)."""
    members: tuple[MemberStats, ...] = ()
    """A pool's engines, in ``--engine-url`` order; empty for a single engine."""

    def member_figures(self) -> dict[str, dict[str, float]] | None:
        """Per member URL its ``/metrics`` figures; None for a single engine."""
        return {m.url: m.figures() for m in self.members} if self.members else None


class StreamingEngine(Protocol):
    """An engine that also streams (SGLang ``/generate`` with ``stream: true``, the
    embedded engine). Engines without it are streamed as one final chunk
    (:func:`stream_generate`)."""

    def generate_stream(
        self,
        input_ids: TokenIds,
        params: SamplingParams,
        rid: str,
        *,
        replay: ReplayRequest | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """Chunks as ids arrive; the last one carries the :class:`GenerateResult` (the same
        one :meth:`Engine.generate` would return). Closing the iterator early aborts the
        request on the engine."""
        ...


async def stream_generate(engine: Engine, input_ids: TokenIds, params: SamplingParams,
                          rid: str, *, replay: ReplayRequest | None = None,
                          vocab_size: int | None = None
                          ) -> AsyncGenerator[StreamChunk, None]:
    """Stream from ``engine``: its own ``generate_stream`` when it has one, else one final
    chunk from ``generate``. ``vocab_size``: the new ids of every chunk but the last
    (which :func:`check_output` checks whole) must be token ids in ``[0, vocab_size)``,
    else ``engine_protocol_error``: nothing unchecked is streamed."""
    streaming = getattr(engine, "generate_stream", None)
    if streaming is None:
        result = await engine.generate(input_ids, params, rid, replay=replay)
        yield StreamChunk(result.output_ids, result)
        return
    chunks = streaming(input_ids, params, rid, replay=replay)
    checked = 0
    try:
        async for chunk in chunks:
            if vocab_size is not None and chunk.result is None:
                checked = check_stream_ids(chunk.output_ids, checked, vocab_size)
            yield chunk
    finally:  # closed early: the engine's stream (its HTTP request) ends now
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()


@runtime_checkable
class Engine(Protocol):
    """An inference engine reached with token ids."""

    name: str

    async def generate(
        self,
        input_ids: TokenIds,
        params: SamplingParams,
        rid: str,
        *,
        replay: ReplayRequest | None = None,
    ) -> GenerateResult:
        """Generate one completion for ``input_ids``; raise :class:`EngineError` on failure.
        ``replay``: also return routing / indexer rows from ``replay.start_len`` on."""
        ...

    async def abort(self, rid: str) -> None:
        """Abort the in-flight request ``rid`` (no error if it already finished)."""
        ...

    async def context_length(self) -> int | None:
        """Maximum prompt + completion tokens of the served model, if the engine knows."""
        ...

    async def pause(self, mode: PauseMode = "retract") -> None: ...

    async def resume(self) -> None: ...

    async def update_weight_version(self, version: str) -> None:
        """Report ``version`` in the results of later generations (a weight update)."""
        ...

    async def health(self) -> bool: ...

    async def probe(self) -> str | None:
        """None when the engine is up, else a short reason (for ``/health``)."""
        ...

    def stats(self) -> EngineStats:
        """Its name, URL and counters now (cheap: no request to the engine)."""
        ...

    async def close(self) -> None: ...


_INT = frozenset({int})
_NUMBER = frozenset({int, float})

LOGPROB_TOLERANCE = 1e-5
"""Largest positive logprob accepted (rounding in an engine's log-softmax); above: invalid."""


@dataclass(frozen=True, slots=True)
class CheckedOutput:
    """A generation's ids and logprobs, validated and in their stored dtypes."""

    ids: np.ndarray
    """int32 output ids, each in ``[0, vocab_size)``."""
    logprobs: np.ndarray
    """Logprobs, finite and <= 0: float32 when every value the engine sent is exactly a
    float32 (so storing them compactly loses nothing), else float64."""


def check_output(result: GenerateResult, vocab_size: int) -> CheckedOutput:
    """Validate what an engine generated before anything is stored (design §5.1).

    Raises :class:`EngineError` ``engine_protocol_error`` naming the first bad entry: an id
    that is not an integer or not in the vocabulary, a logprob that is not finite or
    above 0; or a ``stop`` with no output ids (a stop always ends on a generated id, the
    EOS/stop token or the one completing a stop string: committing nothing would leave
    the session without its closing token). The common case is a few C-level passes over
    the lists (microseconds); only a failing check walks the entries to name the culprit.
    """
    ids, logprobs = result.output_ids, result.logprobs
    if result.finish_reason == "stop" and not len(ids):
        raise _protocol("finish_reason stop with no output ids (a stop ends on the stop "
                        "token the engine generated, which output_ids must include)")
    checked = result.checked
    if checked is not None and len(checked.ids) == len(ids):
        if len(ids) and int(checked.ids.max()) >= vocab_size:  # the same ids, as int32
            raise _protocol(_first_bad_id(ids, vocab_size))
        return checked
    if not _ids_ok(ids, vocab_size):
        raise _protocol(_first_bad_id(ids, vocab_size))
    if not _logprobs_ok(logprobs):
        raise _protocol(_first_bad_logprob(logprobs))
    return CheckedOutput(np.asarray(ids, dtype=IDS_DTYPE),
                         compact_logprobs(logprobs))


def check_stream_ids(ids: Sequence[Any], start: int, vocab_size: int) -> int:
    """Check ``ids[start:]`` (the ids a stream chunk added) are token ids in
    ``[0, vocab_size)``; the new count of checked ids. Work in proportion to the new ids."""
    if len(ids) > start:
        new = ids[start:]
        if not _ids_ok(new, vocab_size):
            raise _protocol("stream chunk: " + _first_bad_id(new, vocab_size, start))
    return max(start, len(ids))


def compact_logprobs(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """``values`` as float32 when that round-trips every value exactly, else float64."""
    if isinstance(values, list):  # the common case: a reply's floats (list equality is C)
        narrow = np.array(values, dtype=LOGPROB_DTYPE)
        return narrow if narrow.tolist() == values else np.array(values, dtype=np.float64)
    wide = np.asarray(values, dtype=np.float64)
    narrow = wide.astype(LOGPROB_DTYPE)
    return narrow if np.array_equal(narrow, wide) else wide


def _ids_ok(ids: Sequence[Any], vocab_size: int) -> bool:
    if not ids:
        return True
    if isinstance(ids, np.ndarray):
        return ids.dtype.kind in "iu" and int(ids.min()) >= 0 and int(ids.max()) < vocab_size
    return set(map(type, ids)) <= _INT and min(ids) >= 0 and max(ids) < vocab_size


def _logprobs_ok(logprobs: Sequence[Any]) -> bool:
    if not logprobs:
        return True
    if not set(map(type, logprobs)) <= _NUMBER:
        return False
    # one NaN or infinity makes the sum non-finite (so does an absurd -1e308 pair)
    return math.isfinite(sum(logprobs)) and max(logprobs) <= LOGPROB_TOLERANCE


def _first_bad_id(ids: Sequence[Any], vocab_size: int, offset: int = 0) -> str:
    for i, tok in enumerate(ids, start=offset):
        if isinstance(tok, (bool, float, str)) or not isinstance(tok, (int, np.integer)):
            return f"output_ids[{i}] = {tok!r} is not an integer token id"
        if not 0 <= tok < vocab_size:
            return f"output_ids[{i}] = {int(tok)} is outside the vocabulary [0, {vocab_size})"
    return "output ids are malformed"


def _first_bad_logprob(logprobs: Sequence[Any]) -> str:
    for i, value in enumerate(logprobs):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) \
                or not math.isfinite(value) or value > LOGPROB_TOLERANCE:
            return f"logprob {i} = {value!r} is not a finite number <= 0"
    return "logprobs overflow (not finite in sum)"


def _protocol(problem: str) -> EngineError:
    return EngineError(f"engine reply: {problem}", code="engine_protocol_error")
