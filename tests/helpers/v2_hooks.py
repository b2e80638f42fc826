"""Sample hooks named by dotted path in the v2 tests (``--sample-picker v2_hooks:...``)."""

from __future__ import annotations

from typing import Any

from tito.samples.sample import Sample


def keep_all(leaf_samples: list[Sample], session_metadata: dict[str, Any]) -> list[Sample]:
    return list(leaf_samples)


def copies(leaf_samples: list[Sample], session_metadata: dict[str, Any]) -> list[Sample]:
    import copy

    return [copy.deepcopy(s) for s in leaf_samples]


def broken(leaf_samples: list[Sample], session_metadata: dict[str, Any]) -> list[Sample]:
    raise RuntimeError("picker bug")


async def async_pick(leaf_samples: list[Sample], session_metadata: dict[str, Any]
                     ) -> list[Sample]:
    return leaf_samples
