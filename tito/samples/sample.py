"""The training sample a trainer receives (design §6).

A :class:`Sample` follows the slime/miles convention: ``tokens`` is the whole sequence
(first prompt + everything after it) and the per-token training fields (``loss_mask``,
``rollout_log_probs``) cover only the *response region*, the last ``response_length``
tokens. Routed experts (R3), when present, hold one row per position fed to the model,
i.e. ``len(tokens) - 1`` rows.

This module holds the data type and small pure helpers shared by assembly and the wire
codec; it does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from tito.types.errors import AssemblyError

SampleStatus = Literal["completed", "truncated", "aborted", "pending", "failed"]
STATUSES: tuple[str, ...] = ("completed", "truncated", "aborted", "pending", "failed")
"""The reference framework's ``Sample.Status`` values. Assembly gives the first three;
``pending`` and ``failed`` are accepted when decoding a reference server's payload."""

TOKENS_DTYPE = np.dtype(np.int64)
LOSS_MASK_DTYPE = np.dtype(np.uint8)
LOGPROBS_DTYPE = np.dtype(np.float64)
"""``rollout_log_probs`` of a sample and on the wire: float64, what the reference
framework's decoder requires (the stored float32 values widen exactly)."""
ROUTED_EXPERTS_DTYPE = np.dtype(np.int32)
REPLAY_FIELDS = ("rollout_routed_experts", "rollout_indexer_topk")
"""Per-position replay tensors: one int32 row per position fed to the model."""
SAMPLING_MASK_DTYPE = np.dtype(np.int32)
SAMPLING_MASK_OFFSETS_DTYPE = np.dtype(np.int64)
MASK_FIELDS = ("rollout_sampling_mask", "rollout_sampling_mask_offsets")
"""Sampling-mask replay: kept token ids (int32) and their per-position offsets (int64)."""

_FINISH_TO_STATUS: dict[str, SampleStatus] = {
    "stop": "completed",
    "tool_calls": "completed",
    "length": "truncated",
    "abort": "aborted",
}


@dataclass(eq=False, kw_only=True, slots=True)
class Sample:
    """One training sample: a whole trajectory (v1) or one root-to-leaf path (v2).

    Compare samples with :func:`samples_identical` (``==`` is identity: the fields are
    numpy arrays).
    """

    tokens: np.ndarray
    """int64, 1-D: the whole sequence (first prompt + everything after it)."""
    response_length: int
    """Number of tokens after the first prompt; the tail of ``tokens`` that trains."""
    loss_mask: np.ndarray | None
    """uint8, ``response_length`` entries: 1 on generated ids, 0 on bridge ids."""
    rollout_log_probs: np.ndarray | None
    """float64, ``response_length`` entries: the engine's logprob, 0.0 on bridge ids."""
    rollout_routed_experts: np.ndarray | None = None
    """int32 ``(len(tokens) - 1, layers, top_k)`` expert ids, or None without R3."""
    rollout_indexer_topk: np.ndarray | None = None
    """int32 ``(len(tokens) - 1, indexer_layers, top_k)`` sparse-attention indexer top-k,
    or None without indexer replay."""
    rollout_sampling_mask: np.ndarray | None = None
    """int32: the kept token ids (top-k / top-p survivors) of every response position,
    concatenated; bridge positions keep none. None without sampling-mask replay."""
    rollout_sampling_mask_offsets: np.ndarray | None = None
    """int64, ``response_length + 1`` entries: response position ``i`` kept
    ``rollout_sampling_mask[offsets[i]:offsets[i + 1]]``; None with the ids."""
    response: str | None = ""
    """The response region decoded as text (None when the collector asked to leave it out)."""
    status: SampleStatus = "completed"
    weight_versions: list[str | None] = field(default_factory=list)
    """Engine weight version of each kept turn, in order."""
    weight_version_calls: list[list[dict[str, Any]]] = field(default_factory=list)
    """Per kept turn (one engine call each), which weight version generated which ids:
    ``[{"version", "abs_start", "abs_end"}]`` over positions of ``tokens`` (the reference
    framework's ``WeightVersionsPerCall``); ``[]`` for a turn whose engine reported no
    version. On the wire only when asked for (``weight_versions_format: spans``)."""
    spec_info: dict[str, int] | None = None
    """Speculative-decoding counters summed over the kept turns, in the reference
    framework's ``SpecInfo`` shape (``spec_num_correct_drafts``,
    ``spec_num_proposed_drafts``, ``spec_verify_ct``, ``completion_tokens``); None when
    no kept turn reported any."""
    metadata: dict[str, Any] = field(default_factory=dict)
    reward: float | None = None
    prefix_cache_info: dict[str, int] = field(default_factory=lambda: {
        "cached_tokens": 0, "total_prompt_tokens": 0})
    """Prefix-cache use over the kept turns: engine-reported cached tokens and prompt
    tokens, summed (the reference framework's ``PrefixCacheInfo``)."""
    rollout_id: int | str | None = None
    """Driver-side, not on the wire: set when one trajectory gave several samples (v2
    leaves), so a trainer counts them as one rollout; None for a single sample."""

    @property
    def prompt_length(self) -> int:
        """Length of the first prompt (the tokens that precede the response region)."""
        return len(self.tokens) - self.response_length


def status_from_finish_reason(finish_reason: str) -> SampleStatus:
    """Sample status of an engine finish reason.

    ``stop`` (and OpenAI's ``tool_calls``) → ``completed``, ``length`` → ``truncated``,
    ``abort`` → ``aborted``; anything else is an :class:`AssemblyError` (a record we do not
    know how to train on must not silently become a completed sample).
    """
    try:
        return _FINISH_TO_STATUS[finish_reason]
    except KeyError:
        known = sorted(_FINISH_TO_STATUS)
        raise AssemblyError(
            f"unknown finish_reason {finish_reason!r} (expected one of {known})"
        ) from None


def sample_problem(sample: Sample) -> str | None:
    """The first structural inconsistency of ``sample``, or None when it is well formed.

    Checks ranks, lengths and JSON-side field types; it does not check dtypes (the codec
    converts or rejects those itself). Callers wrap the message in their own error type.
    """
    for check in (_length_problem, _training_fields_problem, _routed_experts_problem,
                  _sampling_mask_problem, _json_fields_problem, _weight_calls_problem):
        problem = check(sample)
        if problem is not None:
            return problem
    return None


def _length_problem(sample: Sample) -> str | None:
    """``tokens`` is 1-D and ``0 <= response_length <= len(tokens)``."""
    tokens = sample.tokens
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1:
        return f"tokens must be a 1-D array, got {_describe(tokens)}"
    rl = sample.response_length
    if not _is_int(rl) or rl < 0:
        return f"response_length must be a non-negative int, got {rl!r}"
    if rl > len(tokens):
        return f"response_length {rl} exceeds len(tokens) {len(tokens)}"
    return None


def _training_fields_problem(sample: Sample) -> str | None:
    """``loss_mask`` and ``rollout_log_probs``, when present, are 1-D with
    ``response_length`` entries (the lengths are already checked)."""
    rl = sample.response_length
    for name in ("loss_mask", "rollout_log_probs"):
        arr = getattr(sample, name)
        if arr is None:
            continue
        if not isinstance(arr, np.ndarray) or arr.ndim != 1:
            return f"{name} must be a 1-D array, got {_describe(arr)}"
        if len(arr) != rl:
            return f"{name} has {len(arr)} entries but response_length is {rl}"
    return None


def _routed_experts_problem(sample: Sample) -> str | None:
    """``rollout_routed_experts`` and ``rollout_indexer_topk``, when present, are 3-D with
    ``len(tokens) - 1`` rows."""
    for name in REPLAY_FIELDS:
        rows_of = getattr(sample, name)
        if rows_of is None:
            continue
        if not isinstance(rows_of, np.ndarray) or rows_of.ndim != 3:
            return f"{name} must be a 3-D array, got {_describe(rows_of)}"
        rows = max(len(sample.tokens) - 1, 0)
        if rows_of.shape[0] != rows:
            return f"{name} has {rows_of.shape[0]} rows but len(tokens) - 1 is {rows}"
    return None


def _sampling_mask_problem(sample: Sample) -> str | None:
    """The kept ids and their offsets come together: 1-D, ``response_length + 1``
    non-decreasing offsets from 0 to ``len(ids)``."""
    ids, offsets = sample.rollout_sampling_mask, sample.rollout_sampling_mask_offsets
    if ids is None and offsets is None:
        return None
    if ids is None or offsets is None:
        return "rollout_sampling_mask and rollout_sampling_mask_offsets come together"
    for name, arr in zip(MASK_FIELDS, (ids, offsets), strict=True):
        if not isinstance(arr, np.ndarray) or arr.ndim != 1:
            return f"{name} must be a 1-D array, got {_describe(arr)}"
    if len(offsets) != sample.response_length + 1:
        return (f"rollout_sampling_mask_offsets has {len(offsets)} entries but "
                f"response_length + 1 is {sample.response_length + 1}")
    if offsets[0] != 0 or offsets[-1] != len(ids) or bool((np.diff(offsets) < 0).any()):
        return (f"rollout_sampling_mask_offsets must rise from 0 to len(rollout_sampling_mask)"
                f" ({len(ids)}) without decreasing")
    return None


def _json_fields_problem(sample: Sample) -> str | None:
    """The fields that travel as JSON have JSON types and a known ``status``."""
    if sample.response is not None and not isinstance(sample.response, str):
        return f"response must be a str or null, got {type(sample.response).__name__}"
    if sample.status not in STATUSES:
        return f"status must be one of {list(STATUSES)}, got {sample.status!r}"
    wv = sample.weight_versions
    if not isinstance(wv, list) or not all(v is None or isinstance(v, str) for v in wv):
        return f"weight_versions must be a list of str or null, got {wv!r}"
    if not isinstance(sample.metadata, dict):
        return f"metadata must be an object, got {type(sample.metadata).__name__}"
    reward = sample.reward
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        return f"reward must be a number or null, got {reward!r}"
    return None


def _weight_calls_problem(sample: Sample) -> str | None:
    """``weight_version_calls``: a list of calls, each a list of spans
    ``{version: str, abs_start: int, abs_end: int}`` that rise without overlap inside
    ``tokens`` (the reference framework's ``Sample.validate`` rule)."""
    calls = sample.weight_version_calls
    if not isinstance(calls, list) or not all(isinstance(c, list) for c in calls):
        return f"weight_version_calls must be a list of lists of spans, got {calls!r}"
    previous_end = 0
    for span in (span for call in calls for span in call):
        if not (isinstance(span, dict) and set(span) == _SPAN_KEYS
                and isinstance(span["version"], str) and span["version"]
                and _is_int(span["abs_start"]) and _is_int(span["abs_end"])):
            return ("weight version span must be {version: non-empty str, abs_start: int, "
                    f"abs_end: int}}, got {span!r}")
        if not previous_end <= span["abs_start"] < span["abs_end"] <= len(sample.tokens):
            return (f"invalid weight version span {span} (previous end {previous_end}, "
                    f"len(tokens) {len(sample.tokens)})")
        previous_end = span["abs_end"]
    info = sample.spec_info
    if info is not None and not (isinstance(info, dict) and all(
            isinstance(k, str) and _is_int(v) for k, v in info.items())):
        return f"spec_info must be an object of integer counters, got {info!r}"
    return None


_SPAN_KEYS = frozenset({"version", "abs_start", "abs_end"})


def samples_identical(a: Sample, b: Sample) -> bool:
    """Bitwise equality: same dtypes, shapes and bytes (so ``0.0 != -0.0``), same JSON fields
    (``weight_version_calls`` aside: a payload carries it only in the spans format)."""
    for name in ("tokens", "loss_mask", "rollout_log_probs", *REPLAY_FIELDS, *MASK_FIELDS):
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None):
            return False
        if x is not None and not _arrays_identical(x, y):
            return False
    return (
        a.response_length == b.response_length
        and a.response == b.response
        and a.status == b.status
        and a.weight_versions == b.weight_versions
        and a.spec_info == b.spec_info
        and a.metadata == b.metadata
        and _same_reward(a.reward, b.reward)
    )


def _arrays_identical(x: np.ndarray, y: np.ndarray) -> bool:
    return (
        x.dtype == y.dtype
        and x.shape == y.shape
        and np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()
    )


def _same_reward(x: float | None, y: float | None) -> bool:
    if x is None or y is None:
        return x is y
    return np.float64(x).tobytes() == np.float64(y).tobytes()


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__
