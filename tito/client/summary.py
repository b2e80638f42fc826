"""The numbers of a rollout: :func:`summarize` counts what the final table and
``summary.json`` show."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from tito.client.checks import sample_violations, strict_mismatches
from tito.client.results import RolloutResult, TrajectoryResult
from tito.samples import STATUSES, Sample
from tito.types.mismatch import MISMATCH_TYPES

MAX_REPORTED = 20
"""At most this many violation / error lines are kept in the summary."""


@dataclass(slots=True)
class RolloutSummary:
    """The numbers of the final table; :meth:`to_dict` is ``summary.json``."""

    trajectories: int = 0
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    samples: int = 0
    leaves: int = 0
    """v2: leaves of the trajectory trees (0 with v1 sessions)."""
    dropped_leaves: int = 0
    """v2: leaves that gave no sample (superseded retries, truncated away)."""
    turns: int = 0
    """Turns kept in the samples (assembly may drop turns, e.g. after truncation)."""
    turns_run: int = 0
    """Turns the gateway recorded (``num_turns`` of each session)."""
    multi_turn_samples: int = 0
    """Samples that hold more than one turn."""
    length_cut_turns: int = 0
    """Turns in the samples that the engine cut (``finish_reason=length``: metadata
    ``length_cut_turns``); the turns after them are in the samples too."""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    bridge_tokens: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    collect_failures: int = 0
    empty_samples: int = 0
    tito_violations: int = 0
    strict_mismatches: int = 0
    discarded_turns: int = 0
    """Generated turns a request discarded (a v1 rollback, a retry), as the samples'
    ``tito_discarded_turns`` report them."""
    tolerated: dict[str, int] = field(default_factory=dict)
    """Differences the ``harness`` matcher tolerated in echoed messages, by kind."""
    mismatches_by_type: dict[str, int] = field(default_factory=dict)
    mismatch_check_errors: int = 0
    mixed_version_samples: int = 0
    """Samples whose generated ids came from more than one weight version."""
    mixed_version_share: float = 0.0
    mean_reward: float | None = None
    rewarded_samples: int = 0
    positive_reward_samples: int = 0
    """Samples whose reward is above 0."""
    wall_time_s: float = 0.0
    generated_tokens_per_s: float = 0.0
    interrupted: bool = False
    abort_hook_called: bool = False
    sessions_deleted_at_exit: int = 0
    requeued_trajectories: int = 0
    """On Ray: trajectories run again after their node or gateway was lost."""
    duplicates_dropped: int = 0
    violations: list[str] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing failed: every trajectory finished, no violation, no strict mismatch."""
        return (not self.interrupted and self.failed == 0 and self.cancelled == 0
                and self.tito_violations == 0 and self.strict_mismatches == 0)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _mixed_versions(sample: Sample) -> bool:
    """Whether the sample's generated ids came from more than one weight version."""
    spans = sample.metadata.get("weight_version_spans")
    if isinstance(spans, list) and spans:
        return len({span.get("version") for span in spans if isinstance(span, dict)}) > 1
    return len(set(sample.weight_versions)) > 1


def _count_trajectory(s: RolloutSummary, traj: TrajectoryResult) -> None:
    if traj.error is not None:
        s.failed += 1
        if len(s.errors) < MAX_REPORTED:
            s.errors.append({"prompt_index": traj.prompt_index,
                             "sample_index": traj.sample_index, "error": traj.error})
        return
    s.finished += 1
    if traj.leaves:
        s.leaves += traj.leaves
        s.dropped_leaves += max(traj.leaves - len(traj.samples), 0)


def _count_replay(s: RolloutSummary, meta: dict[str, Any]) -> None:
    """Discarded turns and tolerated differences of one sample's path."""
    for item in meta.get("tito_discarded_turns") or []:
        if isinstance(item, dict):
            s.discarded_turns += int(item.get("discarded") or 0)
    for item in meta.get("tito_tolerated") or []:
        for kind, count in item.items() if isinstance(item, dict) else ():
            if kind != "turn" and isinstance(count, int):
                s.tolerated[kind] = s.tolerated.get(kind, 0) + count


def summarize(result: RolloutResult) -> RolloutSummary:
    """Count everything the table and ``summary.json`` show."""
    s = RolloutSummary(trajectories=result.requested, cancelled=result.cancelled,
                       interrupted=result.interrupted,
                       abort_hook_called=result.abort_hook_called,
                       sessions_deleted_at_exit=result.sessions_deleted_at_exit,
                       requeued_trajectories=result.requeued,
                       duplicates_dropped=result.duplicates_dropped,
                       wall_time_s=round(result.wall_time, 3))
    # the statuses assembly gives, always shown; a decoded "pending"/"failed" only if seen
    statuses: Counter[str] = Counter(dict.fromkeys(STATUSES[:3], 0))
    by_type: Counter[str] = Counter(dict.fromkeys(MISMATCH_TYPES, 0))
    rewards: list[float] = []
    for traj in result.trajectories:
        _count_trajectory(s, traj)
    for traj, sample in result.samples():
        s.samples += 1
        statuses[sample.status] += 1
        meta = sample.metadata
        turns_run = int(meta.get("num_turns") or 0)
        lifecycle = meta.get("lifecycle")
        kept = len(lifecycle) if isinstance(lifecycle, list) else turns_run
        s.turns += kept
        s.turns_run += turns_run
        s.multi_turn_samples += kept > 1
        s.length_cut_turns += len(meta.get("length_cut_turns") or ())
        s.prompt_tokens += sample.prompt_length if sample.response_length else 0
        generated = int(np.asarray(sample.loss_mask).sum()) if sample.loss_mask is not None else 0
        s.generated_tokens += generated
        s.bridge_tokens += sample.response_length - generated
        reason = str(meta.get("aborted_reason") or "")
        s.collect_failures += reason.startswith("collect failed")
        s.empty_samples += reason.startswith("empty")
        s.mismatch_check_errors += "tito_session_mismatch_error" in meta
        for item in meta.get("tito_session_mismatch") or []:
            if isinstance(item, dict) and item.get("type") in by_type:
                by_type[item["type"]] += 1
        s.strict_mismatches += len(strict_mismatches(sample))
        _count_replay(s, meta)
        s.mixed_version_samples += _mixed_versions(sample)
        problems = sample_violations(sample)
        s.tito_violations += len(problems)
        for problem in problems[: max(0, MAX_REPORTED - len(s.violations))]:
            s.violations.append(f"{traj.label}: {problem}")
        reward = sample.reward
        if reward is not None and math.isfinite(reward):
            rewards.append(float(reward))
            s.positive_reward_samples += reward > 0
    s.statuses = dict(statuses)
    s.mixed_version_share = round(s.mixed_version_samples / s.samples, 4) if s.samples else 0.0
    s.mismatches_by_type = dict(by_type)
    s.rewarded_samples = len(rewards)
    s.mean_reward = round(sum(rewards) / len(rewards), 6) if rewards else None
    if result.wall_time > 0:
        s.generated_tokens_per_s = round(s.generated_tokens / result.wall_time, 2)
    return s
