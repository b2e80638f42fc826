"""Sampling-mask replay of a merged sample (design §6).

A record keeps, for each output id, the token ids its sampling kept (top-k / top-p /
min-p survivors): ``sampling_mask_ids`` (int32, concatenated) and
``sampling_mask_offsets`` (int64, ``len(output_ids) + 1``). The sample carries them over
its response region: ``rollout_sampling_mask`` (the kept ids, concatenated) and
``rollout_sampling_mask_offsets`` (``response_length + 1``); a bridge position (tool
results, the next user message, template tokens) was not sampled and keeps none. A trim
or a truncation that cuts a turn's output cuts its kept sets in lockstep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tito.samples.sample import SAMPLING_MASK_DTYPE, SAMPLING_MASK_OFFSETS_DTYPE
from tito.types.errors import AssemblyError
from tito.types.records import TurnRecord


@dataclass(frozen=True, slots=True)
class TurnMask:
    """The kept sets of one turn's (possibly cut) output: ``counts[i]`` ids per position."""

    ids: np.ndarray
    counts: np.ndarray

    def cut(self, keep: int) -> TurnMask:
        counts = self.counts[:keep]
        return TurnMask(self.ids[: int(counts.sum())], counts)


def turn_mask(record: TurnRecord, where: str) -> TurnMask | None:
    """``record``'s kept sets, checked against its output; None when it has none."""
    ids, offsets = record.sampling_mask_ids, record.sampling_mask_offsets
    if ids is None and offsets is None:
        return None
    if ids is None or offsets is None:
        raise AssemblyError(f"{where} has only one of sampling_mask_ids and "
                            "sampling_mask_offsets")
    ids, offsets = np.asarray(ids), np.asarray(offsets)
    n = len(record.output_ids)
    if ids.ndim != 1 or offsets.ndim != 1 or len(offsets) != n + 1:
        raise AssemblyError(f"{where} has {n} output ids but sampling-mask offsets of shape "
                            f"{offsets.shape}")
    counts = np.diff(offsets)
    if offsets[0] != 0 or offsets[-1] != len(ids) or bool((counts < 0).any()):
        raise AssemblyError(f"{where} has sampling-mask offsets that do not rise from 0 to "
                            f"{len(ids)} (the kept ids stored)")
    return TurnMask(ids, counts)


def merge_sampling_mask(parts: Sequence[tuple[int, TurnMask | None]], *, required: bool,
                        turns: Sequence[int]) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids, offsets) over the response region from each kept turn's ``(bridge length,
    mask)`` (the first turn's bridge is the prompt: not in the response). None when no
    turn has a mask and ``required`` is off; a turn without one among turns with one, or
    any missing when ``required``, is an :class:`AssemblyError` naming the turn."""
    have = [mask is not None for _, mask in parts]
    if not any(have) and not required:
        return None
    if not all(have):
        k = have.index(False)
        raise AssemblyError(
            f"sampling-mask replay: kept turn {turns[k]} has no sampling mask (was it "
            "generated before --sampling-mask-replay was on, or by an engine that ignores "
            "return_sampling_mask?)")
    ids_parts: list[np.ndarray] = []
    count_parts: list[np.ndarray] = []
    for k, (bridge, mask) in enumerate(parts):
        assert mask is not None
        if k:
            count_parts.append(np.zeros(bridge, SAMPLING_MASK_OFFSETS_DTYPE))
        count_parts.append(mask.counts)
        ids_parts.append(mask.ids)
    offsets = np.zeros(sum(map(len, count_parts)) + 1, SAMPLING_MASK_OFFSETS_DTYPE)
    np.cumsum(np.concatenate(count_parts), out=offsets[1:])
    ids = np.concatenate(ids_parts).astype(SAMPLING_MASK_DTYPE, copy=False)
    return np.ascontiguousarray(ids), offsets
