"""How a rollout runs its trajectories (:class:`RolloutSettings`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RolloutSettings:
    """How trajectories are run (the ``tito rollout`` flags of the same names)."""

    concurrency: int = 8
    n_per_prompt: int = 1
    max_turns: int = 3
    max_seq_len: int | None = None
    max_new_tokens: int = 64
    temperature: float = 0.7
    seed: int | None = None
    """Trajectory ``t`` (``prompt_index * n_per_prompt + sample_index``) samples with
    ``seed + t``; None: unseeded."""
    collect_timeout: float = 120.0

    def __post_init__(self) -> None:
        for name in ("concurrency", "n_per_prompt", "max_turns", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.collect_timeout <= 0:
            raise ValueError("collect_timeout must be positive")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ValueError("max_seq_len must be at least 2")

    def sampling(self, trajectory: int) -> dict[str, Any]:
        """The sampling settings of one trajectory (our names; the agent gets OpenAI's)."""
        out: dict[str, Any] = {"max_new_tokens": self.max_new_tokens,
                               "temperature": self.temperature}
        if self.seed is not None:
            out["sampling_seed"] = self.seed + trajectory
        return out

