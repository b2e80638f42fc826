"""The token strip of a trajectory and its pages (pure: no I/O).

A :class:`Trajectory` holds, per token, its id, its origin (the first turn's prompt,
``bridge`` ids the gateway inserted — template text and appended messages such as tool
results —, or ``generated`` ids), the loss mask the assembled sample gives it, and the
engine's logprob; plus the turns (boundaries, finish reason, latency) and the blocks
(thinking, tool calls, tool results). It is built from a session's records
(:func:`from_records`) or from a sample written by ``tito rollout``
(:func:`from_sample`), and served in pages of at most :data:`MAX_PAGE` tokens
(:func:`page`), so a 100,000-token trajectory never travels as one body.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tito.samples.sample import Sample
from tito.server.ui.blocks import BRIDGE, GENERATED, PROMPT, Hints, Segment, find_blocks
from tito.types.records import TurnRecord, snapshot_ids

MAX_PAGE = 16_384
DEFAULT_PAGE = 4096
ORIGINS = ("prompt", "bridge", "generated")
_ORIGIN_CHARS = np.frombuffer(b"pbg", dtype=np.uint8)
_MASK_CHARS = np.frombuffer(b"x-01", dtype=np.uint8)
NOT_IN_SAMPLE, OUTSIDE_RESPONSE = -2, -1
"""Mask codes besides 0 and 1: the token is not in the assembled sample (cut by
``max_seq_len``, after an aborted turn, or no sample); the token is in the
sample's prompt (before the response region the mask covers)."""
_FINISH_OF_STATUS = {"completed": "stop", "truncated": "length", "aborted": "abort"}

Texts = Callable[[np.ndarray], list[str]]
"""Per-token texts of ids (:func:`tito.server.ui.text.token_texts`)."""


@dataclass(slots=True)
class Trajectory:
    ids: np.ndarray
    """int64 token ids."""
    origin: np.ndarray
    """uint8: PROMPT, BRIDGE or GENERATED."""
    mask: np.ndarray
    """int8: 1 / 0 as the sample's loss mask, or NOT_IN_SAMPLE / OUTSIDE_RESPONSE."""
    logprobs: np.ndarray
    """float64: the engine's logprob on generated ids, NaN elsewhere."""
    texts: list[str] | None
    """Per-token text; None when no tokenizer is at hand (the page shows ids)."""
    turns: list[dict[str, Any]]
    """Per turn: ``turn``, ``start`` (its bridge), ``gen_start``, ``end``,
    ``finish_reason``, ``e2e_latency`` and where known ``node_id``, ``weight_version``."""
    blocks: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)


def from_records(records: Sequence[TurnRecord], hints: Sequence[tuple[Hints, Hints]],
                 sample: Sample | None, texts: Texts | None,
                 node_ids: Sequence[int] | None = None) -> Trajectory:
    """The trajectory of a session path. ``hints[k]``: (bridge, output) hints of record k
    (empty when unknown); ``sample``: the assembled sample of this path (its loss mask),
    or None when there is none."""
    ids = snapshot_ids(list(records)).astype(np.int64)
    origin = np.full(len(ids), BRIDGE, dtype=np.uint8)
    logprobs = np.full(len(ids), np.nan)
    segments: list[Segment] = []
    turns: list[dict[str, Any]] = []
    pos = 0
    for k, rec in enumerate(records):
        if rec.drop and turns:  # the family's trailing trim of the previous output
            pos -= rec.drop
            turns[-1]["end"] = pos
            prev = segments[-1]
            segments[-1] = Segment(prev.start, pos, prev.origin, prev.turn, prev.hints)
        bridge_hints, output_hints = hints[k] if k < len(hints) else (Hints(), Hints())
        gen = pos + len(rec.bridge_ids)
        end = gen + len(rec.output_ids)
        segments.append(Segment(pos, gen, PROMPT if k == 0 else BRIDGE, k, bridge_hints))
        segments.append(Segment(gen, end, GENERATED, k, output_hints))
        turns.append({"turn": k, "start": pos, "gen_start": gen, "end": end,
                      "finish_reason": rec.finish_reason, "e2e_latency": rec.e2e_latency,
                      "weight_version": rec.weight_version,
                      "node_id": None if node_ids is None else int(node_ids[k])})
        pos = end
    for seg in segments:
        origin[seg.start : seg.end] = seg.origin
    for k, turn in enumerate(turns):
        gen, end = turn["gen_start"], turn["end"]
        logprobs[gen:end] = np.asarray(records[k].logprobs[: end - gen], dtype=np.float64)
    traj = Trajectory(ids, origin, _mask(ids, sample), logprobs, None, turns)
    return _finish(traj, segments, texts, sample)


def from_sample(tokens: np.ndarray, prompt_length: int, loss_mask: np.ndarray | None,
                logprobs: np.ndarray | None, status: str, metadata: dict[str, Any],
                texts: Texts | None) -> Trajectory:
    """The trajectory of one written sample: the prompt, then generated spans (the
    sample's ``leaf.completion_spans`` when it has them, else its loss-mask runs) with
    bridge ids between them; lifecycle entries give the turns' latencies."""
    ids = np.asarray(tokens, dtype=np.int64)
    n, pl = len(ids), int(prompt_length)
    rl = n - pl
    mask_r = np.zeros(rl, np.uint8) if loss_mask is None else np.asarray(loss_mask)[:rl]
    origin = np.full(n, BRIDGE, dtype=np.uint8)
    origin[:pl] = PROMPT
    spans = _completion_spans(metadata, pl, n) or [(None, a, b) for a, b in _runs(mask_r, pl)]
    lps = np.full(n, np.nan)
    response_lps = None if logprobs is None else np.asarray(logprobs, dtype=np.float64)
    segments: list[Segment] = []
    turns: list[dict[str, Any]] = []
    raw_lifecycle = metadata.get("lifecycle")
    lifecycle = raw_lifecycle if isinstance(raw_lifecycle, list) else []
    start = 0
    for k, (node, a, b) in enumerate(spans):
        origin[a:b] = GENERATED
        if response_lps is not None:
            lps[a:b] = response_lps[a - pl : b - pl]
        segments += [Segment(start, a, PROMPT if k == 0 else BRIDGE, k),
                     Segment(a, b, GENERATED, k)]
        last = k == len(spans) - 1
        turns.append({"turn": k, "start": start, "gen_start": a, "end": b,
                      "finish_reason": _FINISH_OF_STATUS.get(status) if last else "stop",
                      "e2e_latency": _latency(lifecycle, k), "weight_version": None,
                      "node_id": node})
        start = b
    mask = np.full(n, OUTSIDE_RESPONSE, dtype=np.int8)
    mask[pl:] = mask_r.astype(np.int8)
    traj = Trajectory(ids, origin, mask, lps, None, turns)
    return _finish(traj, segments, texts, None)


def _finish(traj: Trajectory, segments: list[Segment], texts: Texts | None,
            sample: Sample | None) -> Trajectory:
    if texts is not None and len(traj):
        traj.texts = texts(traj.ids)
        traj.blocks = find_blocks(traj.texts, segments)
    counts = np.bincount(traj.origin, minlength=3)
    traj.info.update({
        "num_tokens": len(traj), "num_turns": len(traj.turns),
        "origins": {name: int(c) for name, c in zip(ORIGINS, counts, strict=True)},
        "mask_on": int((traj.mask == 1).sum()),
        "not_in_sample": int((traj.mask == NOT_IN_SAMPLE).sum()),
        "has_text": traj.texts is not None,
    })
    if sample is not None:
        traj.info["sample_status"] = sample.status
    return traj


def _mask(ids: np.ndarray, sample: Sample | None) -> np.ndarray:
    mask = np.full(len(ids), NOT_IN_SAMPLE, dtype=np.int8)
    if sample is None or sample.loss_mask is None:
        return mask
    n, pl = len(sample.tokens), sample.prompt_length
    if n > len(ids) or not np.array_equal(np.asarray(sample.tokens), ids[:n]):
        return mask  # not this path's sample: say nothing rather than something wrong
    mask[:pl] = OUTSIDE_RESPONSE
    mask[pl:n] = np.asarray(sample.loss_mask, dtype=np.int8)
    return mask


def _completion_spans(metadata: dict[str, Any], pl: int, n: int
                      ) -> list[tuple[int | None, int, int]]:
    """(node id, start, end) of each generated span of a v2 leaf sample."""
    leaf = metadata.get("leaf")
    raw = leaf.get("completion_spans") if isinstance(leaf, dict) else None
    if not isinstance(raw, list):
        return []
    spans: list[tuple[int | None, int, int]] = []
    for item in raw:
        if isinstance(item, list) and len(item) == 3 and pl <= item[1] <= item[2] <= n:
            spans.append((int(item[0]), int(item[1]), int(item[2])))
    return spans


def _runs(mask: np.ndarray, offset: int) -> list[tuple[int, int]]:
    """(start, end) of each run of 1 in ``mask``, shifted by ``offset``."""
    on = np.concatenate([[0], (np.asarray(mask) == 1).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(on))
    return [(offset + int(a), offset + int(b)) for a, b in zip(edges[::2], edges[1::2],
                                                                strict=True)]


def _latency(lifecycle: list[Any], k: int) -> float | None:
    entry = lifecycle[k] if k < len(lifecycle) else None
    if not isinstance(entry, dict):
        return None
    t0, t1 = entry.get("t0"), entry.get("t1")
    return float(t1 - t0) if isinstance(t0, int | float) and isinstance(t1, int | float) \
        else None


def page(traj: Trajectory, offset: int, limit: int) -> dict[str, Any]:
    """Tokens ``[offset, offset + limit)``: columns (``origin`` and ``mask`` one character
    per token: ``p``/``b``/``g`` and ``1``/``0``/``-`` prompt/``x`` not in the sample),
    and the turns and blocks that overlap the page."""
    total = len(traj)
    end = min(total, offset + limit)
    lps = traj.logprobs[offset:end]
    return {
        "offset": offset, "limit": limit, "total": total,
        "next_offset": end if end < total else None,
        "ids": traj.ids[offset:end],
        "text": None if traj.texts is None else traj.texts[offset:end],
        "origin": _ORIGIN_CHARS[traj.origin[offset:end]].tobytes().decode(),
        "mask": _MASK_CHARS[traj.mask[offset:end] + 2].tobytes().decode(),
        "logprob": [None if math.isnan(lp) else round(lp, 4) for lp in lps.tolist()],
        "turns": [t for t in traj.turns if t["end"] > offset and t["start"] < end],
        "blocks": [b for b in traj.blocks if b["end"] > offset and b["start"] < end],
    }
