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

ROUTED = ("routed_experts", "routed_experts_start_len", "routing",
          "--enable-return-routed-experts")
INDEXER = ("indexer_topk", "indexer_topk_start_len", "indexer",
           "indexer top-k replay")
"""(record field, its start field, name in messages, what the engine needs)."""


def has_routed_experts(record: TurnRecord) -> bool:
    """Whether ``record`` carries a replay payload (routed experts or indexer top-k)."""
    return record.routed_experts is not None or record.indexer_topk is not None


class _Rows:
    """One replay field of the records (``ROUTED`` or ``INDEXER``)."""

    def __init__(self, kind: tuple[str, str, str, str]) -> None:
        self.field, self.start_field, self.name, self.needs = kind

    def of(self, record: TurnRecord) -> np.ndarray | None:
        value: np.ndarray | None = getattr(record, self.field)
        return value

    def start(self, record: TurnRecord) -> int:
        return int(getattr(record, self.start_field))


def merge_routed_experts(
    records: Sequence[TurnRecord], kept_lens: Sequence[int], *, required: bool = False,
    kind: tuple[str, str, str, str] = ROUTED,
) -> np.ndarray | None:
    """R3 of the merged sample built from ``records`` (the kept turns, in order).

    ``kept_lens[i]`` is the merged sequence length after kept turn ``i``; the sample has
    ``kept_lens[-1]`` tokens and gets exactly ``kept_lens[-1] - 1`` rows. Returns None when
    no kept record carries R3 (``required``: an error, routing replay is on). Raises
    :class:`AssemblyError` on malformed, missing or misaligned payloads, naming the turn and
    the rows.
    """
    rows_of = _Rows(kind)
    if not records:
        return None
    if not any(rows_of.of(r) is not None for r in records):
        if not required:
            return None
        last = records[-1]
        raise AssemblyError(
            f"{rows_of.name} replay: record {len(records) - 1} (turn {last.turn}) has no "
            f"{rows_of.field} payload; the sample needs rows 0..{max(kept_lens[-1] - 1, 0)} "
            f"(does the engine run with {rows_of.needs}?)")
    need = max(kept_lens[-1] - 1, 0)
    _check_shapes(records, rows_of)
    incremental = any(rows_of.of(r) is not None and rows_of.start(r) > 0 for r in records)
    if incremental:
        return _concatenate_patches(records, kept_lens, need, rows_of)
    last = records[-1]
    payload = rows_of.of(last)
    if payload is None:
        raise AssemblyError(
            f"{rows_of.name}: last kept record (turn {last.turn}) has no payload "
            "while earlier records do"
        )
    rows = payload.shape[0]
    if rows < need:
        raise AssemblyError(
            f"{rows_of.name}: last kept record (turn {last.turn}) covers {rows} rows but "
            f"the merged sample needs {need} (len(tokens) - 1)"
        )
    return np.ascontiguousarray(payload[:need])


def _check_shapes(records: Sequence[TurnRecord], rows_of: _Rows) -> None:
    """Every payload is int32 ``(rows, layers, top_k)`` with one shared ``(layers, top_k)``."""
    inner: tuple[int, ...] | None = None
    first = -1
    for i, rec in enumerate(records):
        r3 = rows_of.of(rec)
        if r3 is None:
            continue
        if not isinstance(r3, np.ndarray) or r3.ndim != 3 or r3.dtype != ROUTED_EXPERTS_DTYPE:
            got = f"{r3.dtype} {r3.shape}" if isinstance(r3, np.ndarray) else type(r3).__name__
            raise AssemblyError(
                f"{rows_of.name} of record {i} (turn {rec.turn}) must be an int32 "
                f"(rows, layers, top_k) array, got {got}"
            )
        if inner is None:
            inner, first = r3.shape[1:], i
        elif r3.shape[1:] != inner:
            raise AssemblyError(
                f"{rows_of.name} of record {i} (turn {rec.turn}) have (layers, top_k) "
                f"{r3.shape[1:]} but record {first} has {inner}"
            )


def _concatenate_patches(
    records: Sequence[TurnRecord], kept_lens: Sequence[int], need: int, rows_of: _Rows
) -> np.ndarray:
    patches: list[np.ndarray] = []
    covered = 0
    for i, (rec, kept) in enumerate(zip(records, kept_lens, strict=True)):
        r3 = rows_of.of(rec)
        if r3 is None:
            raise AssemblyError(
                f"incremental {rows_of.name} replay: record {i} (turn {rec.turn}) has no "
                f"{rows_of.field} payload; rows {covered}..{kept - 1} are missing"
            )
        start = rows_of.start(rec)
        if start != covered:
            what = "a gap" if start > covered else "an overlap"
            raise AssemblyError(
                f"incremental {rows_of.name} replay: record {i} (turn {rec.turn}) starts at row "
                f"{start}; rows so far end at {covered} ({what} of {abs(start - covered)} "
                "rows)"
            )
        end = min(start + r3.shape[0], kept)
        patches.append(r3[: end - start])
        covered = end
    if covered < need:
        raise AssemblyError(
            f"incremental {rows_of.name} replay covers {covered} rows but the merged sample "
            f"needs {need} (len(tokens) - 1)"
        )
    return np.ascontiguousarray(np.concatenate(patches)[:need])
