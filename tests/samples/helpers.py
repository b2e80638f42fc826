"""Hand-built record chains for the sample tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tito.types.records import TurnRecord


@dataclass
class Turn:
    """One turn of a hand-written trajectory; ``chain`` fills in the derived fields."""

    bridge: Sequence[int]
    output: Sequence[int]
    logprobs: Sequence[float] | None = None
    drop: int = 0
    finish: str = "stop"
    weight_version: str | None = None
    e2e_latency: float | None = 0.5
    routed_experts: np.ndarray | None = None
    routed_experts_start_len: int = 0
    extra: dict = field(default_factory=dict)


def chain(turns: Sequence[Turn]) -> list[TurnRecord]:
    """Records for ``turns`` with consistent ``prompt_len`` and timestamps."""
    records: list[TurnRecord] = []
    checkpoint = 0
    for i, t in enumerate(turns):
        prompt_len = checkpoint - t.drop + len(t.bridge)
        logprobs = t.logprobs
        if logprobs is None:
            logprobs = [-(i + 1) - j / 8 for j in range(len(t.output))]
        records.append(
            TurnRecord(
                turn=i,
                drop=t.drop,
                bridge_ids=np.asarray(t.bridge, dtype=np.int32),
                output_ids=np.asarray(t.output, dtype=np.int32),
                logprobs=np.asarray(logprobs, dtype=np.float32),
                finish_reason=t.finish,
                prompt_len=prompt_len,
                weight_version=t.weight_version,
                e2e_latency=t.e2e_latency,
                request_ts=100.0 + 10 * i,
                commit_ts=101.0 + 10 * i,
                routed_experts=t.routed_experts,
                routed_experts_start_len=t.routed_experts_start_len,
                **t.extra,
            )
        )
        checkpoint = prompt_len + len(t.output)
    return records


def decode(ids: list[int]) -> str:
    """A stand-in tokenizer decode: ids joined by spaces."""
    assert isinstance(ids, list)
    return " ".join(str(i) for i in ids)


def routing_oracle(tokens: Sequence[int], rows: int, layers: int = 2, k: int = 2) -> np.ndarray:
    """R3 rows that identify their position and token: ``tokens[r] * 1000 + r`` plus a lane."""
    tok = np.asarray(tokens[:rows], dtype=np.int64)
    base = tok * 1000 + np.arange(rows)
    lanes = np.arange(layers * k).reshape(1, layers, k)
    return (base.reshape(-1, 1, 1) * 10 + lanes).astype(np.int32)
