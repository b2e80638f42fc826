"""Routed experts (R3) of a merged sample (design §6).

Row ``r`` of an R3 tensor is the expert routing of position ``r`` as it was fed to the
model, so a sequence of ``n`` tokens needs ``n - 1`` rows (the last token is never fed).
Records carry R3 in one of two modes:

* **full**: every record's tensor starts at row 0 (``routed_experts_start_len == 0``) and
  covers its whole prompt + output; the merged sample uses the *last kept* record's
  tensor, cut to ``len(tokens) - 1`` rows.
* **incremental** ("additional R3"): turn 0 covers rows from 0, each later record only the
  rows from ``routed_experts_start_len`` on. The patches are concatenated in order; each
  must start exactly where the rows still valid so far end.

Rows still valid after turn ``i``: ``min(start_i + rows_i, kept_i)``, where ``kept_i`` is
the token count of the merged sequence after turn ``i`` (its output already cut by the
next turn's declared trailing trim). Without a trim that is ``checkpoint - 1`` (the last
generated token was never fed); with a trim of ``d >= 1`` tokens the earlier rows stay
valid up to ``checkpoint - d`` (the dropped tokens' rows are discarded). A gateway
therefore asks the engine for ``start = min(checkpoint - 1, checkpoint - drop)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tito.samples.sample import ROUTED_EXPERTS_DTYPE
from tito.types.errors import AssemblyError
from tito.types.records import TurnRecord


def has_routed_experts(record: TurnRecord) -> bool:
    """Whether ``record`` carries an R3 payload."""
    return record.routed_experts is not None


def merge_routed_experts(
    records: Sequence[TurnRecord], kept_lens: Sequence[int], *, required: bool = False
) -> np.ndarray | None:
    """R3 of the merged sample built from ``records`` (the kept turns, in order).

    ``kept_lens[i]`` is the merged sequence length after kept turn ``i``; the sample has
    ``kept_lens[-1]`` tokens and gets exactly ``kept_lens[-1] - 1`` rows. Returns None when
    no kept record carries R3 (``required``: an error, routing replay is on). Raises
    :class:`AssemblyError` on malformed, missing or misaligned payloads, naming the turn and
    the rows.
    """
    if not records:
        return None
    if not any(has_routed_experts(r) for r in records):
        if not required:
            return None
        last = records[-1]
        raise AssemblyError(
            f"routing replay: record {len(records) - 1} (turn {last.turn}) has no "
            f"routed_experts payload; the sample needs rows 0..{max(kept_lens[-1] - 1, 0)} "
            "(does the engine run with --enable-return-routed-experts?)")
    need = max(kept_lens[-1] - 1, 0)
    _check_shapes(records)
    incremental = any(has_routed_experts(r) and r.routed_experts_start_len > 0 for r in records)
    if incremental:
        return _concatenate_patches(records, kept_lens, need)
    last = records[-1]
    if last.routed_experts is None:
        raise AssemblyError(
            f"routed experts: last kept record (turn {last.turn}) has no payload "
            "while earlier records do"
        )
    rows = last.routed_experts.shape[0]
    if rows < need:
        raise AssemblyError(
            f"routed experts: last kept record (turn {last.turn}) covers {rows} rows but "
            f"the merged sample needs {need} (len(tokens) - 1)"
        )
    return np.ascontiguousarray(last.routed_experts[:need])


def _check_shapes(records: Sequence[TurnRecord]) -> None:
    """Every payload is int32 ``(rows, layers, top_k)`` with one shared ``(layers, top_k)``."""
    inner: tuple[int, ...] | None = None
    first = -1
    for i, rec in enumerate(records):
        r3 = rec.routed_experts
        if r3 is None:
            continue
        if not isinstance(r3, np.ndarray) or r3.ndim != 3 or r3.dtype != ROUTED_EXPERTS_DTYPE:
            got = f"{r3.dtype} {r3.shape}" if isinstance(r3, np.ndarray) else type(r3).__name__
            raise AssemblyError(
                f"routed experts of record {i} (turn {rec.turn}) must be an int32 "
                f"(rows, layers, top_k) array, got {got}"
            )
        if inner is None:
            inner, first = r3.shape[1:], i
        elif r3.shape[1:] != inner:
            raise AssemblyError(
                f"routed experts of record {i} (turn {rec.turn}) have (layers, top_k) "
                f"{r3.shape[1:]} but record {first} has {inner}"
            )


def _concatenate_patches(
    records: Sequence[TurnRecord], kept_lens: Sequence[int], need: int
) -> np.ndarray:
    patches: list[np.ndarray] = []
    covered = 0
    for i, (rec, kept) in enumerate(zip(records, kept_lens, strict=True)):
        r3 = rec.routed_experts
        if r3 is None:
            raise AssemblyError(
                f"incremental routing replay: record {i} (turn {rec.turn}) has no "
                f"routed_experts payload; rows {covered}..{kept - 1} are missing"
            )
        start = rec.routed_experts_start_len
        if start != covered:
            what = "a gap" if start > covered else "an overlap"
            raise AssemblyError(
                f"incremental routing replay: record {i} (turn {rec.turn}) starts at row "
                f"{start}; rows so far end at {covered} ({what} of {abs(start - covered)} "
                "rows)"
            )
        end = min(start + r3.shape[0], kept)
        patches.append(r3[: end - start])
        covered = end
    if covered < need:
        raise AssemblyError(
            f"additional R3 covers {covered} rows but the merged sample needs {need} "
            "(len(tokens) - 1)"
        )
    return np.ascontiguousarray(np.concatenate(patches)[:need])
