"""Stand-ins for the reference framework's newer ``Sample`` types (its unmerged
``tom/refactor-miles`` line of late 2026-08), written from their field lists: per engine
call ``WeightVersionsPerCall`` (spans ``{version, abs_start, abs_end}`` over ``tokens``)
and ``SpecInfo`` with SGLang's current counter names. ``tito.integrations.miles`` finds
``WeightVersionsPerCall`` beside ``Sample`` and asks for per-call spans."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from helpers.miles_standins import Sample as HeadSample


@dataclass(frozen=True)
class WeightVersionSpan:
    version: str
    abs_start: int
    abs_end: int


@dataclass
class WeightVersionsPerCall:
    spans: list[WeightVersionSpan] = field(default_factory=list)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [asdict(span) for span in self.spans]

    @staticmethod
    def from_dicts(data: list[dict[str, Any]]) -> WeightVersionsPerCall:
        return WeightVersionsPerCall([WeightVersionSpan(**span) for span in data])


@dataclass
class Sample(HeadSample):
    @dataclass
    class SpecInfo:
        spec_num_correct_drafts: int = 0
        spec_num_proposed_drafts: int = 0
        spec_verify_ct: int = 0
        completion_tokens: int = 0

    weight_versions: list[WeightVersionsPerCall] = field(  # type: ignore[assignment]
        default_factory=list)
    spec_info: SpecInfo = field(default_factory=SpecInfo)  # type: ignore[assignment]
