"""What a rollout produced: one :class:`TrajectoryResult` per trajectory, gathered in a
:class:`RolloutResult` (by the local driver or the Ray one)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tito.samples import Sample


@dataclass(slots=True)
class TrajectoryResult:
    """One finished trajectory: its samples, or the error its agent raised."""

    prompt_index: int
    sample_index: int
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    leaves: int = 0
    """v2: leaves of the session's tree (0 for v1)."""

    @property
    def label(self) -> str:
        return f"prompt {self.prompt_index} sample {self.sample_index}"


@dataclass(slots=True)
class RolloutResult:
    """Everything the driver produced; :func:`tito.client.summary.summarize` turns it into
    numbers."""

    trajectories: list[TrajectoryResult]
    requested: int
    cancelled: int = 0
    interrupted: bool = False
    abort_hook_called: bool = False
    sessions_deleted_at_exit: int = 0
    wall_time: float = 0.0
    requeued: int = 0
    """On Ray: trajectories run again because their node (or gateway) was lost."""
    duplicates_dropped: int = 0
    """On Ray: results of a trajectory already recorded (never written twice)."""

    def samples(self) -> list[tuple[TrajectoryResult, Sample]]:
        """Every sample with its trajectory, ordered by (prompt, sample) index."""
        ordered = sorted(self.trajectories, key=lambda t: (t.prompt_index, t.sample_index))
        return [(t, s) for t in ordered for s in t.samples]

