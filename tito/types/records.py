"""What the gateway stores per generated turn (design §5.4).

A record keeps only what sample assembly needs: the *bridge* ids that were appended
to the previous checkpoint (not a copy of the whole history), the exact output ids
and logprobs the engine returned, and small per-turn facts. The full token sequence of
a trajectory is ``concat(record.bridge_ids, record.output_ids)`` over its turns, after
dropping ``record.drop`` trailing tokens of the previous turn (a family's declared
trailing trim, e.g. GLM's stop token that doubles as the next opener).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

IDS_DTYPE = np.int32
LOGPROB_DTYPE = np.float32
"""How logprobs are stored when that is lossless for the engine's values (engines compute
them in float32, so they are); a turn whose values are not float32-exact keeps float64
(:func:`tito.types.engine.check_output`)."""


@dataclass(slots=True)
class TurnRecord:
    """One committed generation."""

    turn: int
    """0-based index of this generation in its trajectory."""
    drop: int
    """Trailing tokens of the previous checkpoint removed before ``bridge_ids`` (0 on turn 0)."""
    bridge_ids: np.ndarray
    """int32 ids appended after the previous checkpoint; on turn 0, the whole prompt."""
    output_ids: np.ndarray
    """int32 ids the engine generated (stop id included when it stopped on one)."""
    logprobs: np.ndarray
    """Logprob of each output id, exactly as the engine sent it: float32 when that is
    lossless (the common case), else float64."""
    finish_reason: str
    """Engine finish reason: ``stop``, ``length`` or ``abort``."""
    prompt_len: int
    """Length of this turn's prompt (previous checkpoint - drop + bridge)."""
    weight_version: str | None = None
    cached_tokens: int = 0
    e2e_latency: float | None = None
    request_ts: float = 0.0
    commit_ts: float = 0.0
    routed_experts: np.ndarray | None = None
    """int32 ``(rows, layers, top_k)`` expert ids, or None when routing replay is off."""
    routed_experts_start_len: int = 0
    """First position covered by ``routed_experts`` (0: the whole prompt + output)."""
    indexer_topk: np.ndarray | None = None
    """int32 ``(rows, indexer_layers, top_k)`` indexer top-k, from the same start position
    as ``routed_experts``, or None when indexer replay is off."""
    indexer_topk_start_len: int = 0
    sampling_mask_ids: np.ndarray | None = None
    """int32 kept token ids of every output position, concatenated (sampling-mask
    replay), or None when it is off."""
    sampling_mask_offsets: np.ndarray | None = None
    """int64, ``len(output_ids) + 1`` entries: output ``i`` kept
    ``sampling_mask_ids[offsets[i]:offsets[i + 1]]``; None with ``sampling_mask_ids``."""
    weight_spans: list[list[Any]] | None = None
    """``[version, start, end]`` over output indices when the weights changed while this
    turn was generated; None: every output id came from ``weight_version``."""
    spec_info: dict[str, Any] | None = None
    """The engine's speculative-decoding counters of this turn (its ``spec_*``
    ``meta_info`` keys, as sent); None without speculative decoding."""
    finish_message: str | None = None
    """The engine's reason for an ``abort`` finish (e.g. a pause in ``abort`` mode)."""
    request: dict[str, Any] = field(default_factory=dict)
    """Small request facts for ``GET /sessions/<id>`` (sampling settings, roles appended)."""
    generation_id: str | None = None
    """The turn's generation id (its response id, the reply's ``X-Miles-Generation-Id``)."""
    links: dict[str, str] | None = None
    """The generation links its request named (:class:`tito.types.messages.TurnLinks`:
    ``previous_response_id``, ``retry_of``, ``supersedes``); None: none."""

    @property
    def checkpoint_len(self) -> int:
        """Length of the token snapshot after this turn (prompt + output)."""
        return self.prompt_len + len(self.output_ids)


def snapshot_ids(records: list[TurnRecord]) -> np.ndarray:
    """The full token snapshot after the last record (int32), rebuilt from the deltas."""
    parts: list[np.ndarray] = []
    length = 0
    for rec in records:
        if rec.drop:
            last = parts[-1]
            parts[-1] = last[: len(last) - rec.drop]
            length -= rec.drop
        parts.append(rec.bridge_ids)
        parts.append(rec.output_ids)
        length += len(rec.bridge_ids) + len(rec.output_ids)
    if not parts:
        return np.zeros(0, dtype=IDS_DTYPE)
    out = np.concatenate(parts).astype(IDS_DTYPE, copy=False)
    assert len(out) == length
    return out
