"""The embedded engine's batch scheduler with a fake model (no weights are loaded)."""

from __future__ import annotations

import logging
import queue
from collections.abc import Iterator, Sequence
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from tito.engines.embedded_sampling import SamplerState  # noqa: E402
from tito.engines.embedded_scheduler import (  # noqa: E402
    BatchScheduler,
    Request,
    SchedulerConfig,
)
from tito.types.engine import GenerateResult, SamplingParams  # noqa: E402
from tito.types.errors import EngineError  # noqa: E402

VOCAB = 16


class _Cache:
    length = 0


class _FailingModel:
    """Stands in for LlamaModel: caches can be made, every forward step raises."""

    cfg = SimpleNamespace(max_position_embeddings=64)

    def __init__(self) -> None:
        self.steps = 0

    def new_cache(self, capacity: int) -> _Cache:
        return _Cache()

    def forward(self, segments: Sequence[object]) -> torch.Tensor:
        self.steps += 1
        raise RuntimeError(f"kernel exploded (step {self.steps})")


@pytest.fixture
def scheduler() -> Iterator[BatchScheduler]:
    threads = torch.get_num_threads()  # the worker sets torch's (process-wide) thread count
    sched = BatchScheduler(_FailingModel(), decode=lambda ids: "",  # type: ignore[arg-type]
                           config=SchedulerConfig(num_threads=1, prefix_cache_bytes=0))
    try:
        yield sched
    finally:
        sched.close(timeout=5)
        torch.set_num_threads(threads)


def _submit(sched: BatchScheduler, rid: str) -> queue.Queue[GenerateResult | BaseException]:
    outcomes: queue.Queue[GenerateResult | BaseException] = queue.Queue()
    params = SamplingParams(max_new_tokens=2)
    sched.submit(Request(rid=rid, prompt=[1, 2, 3], params=params,
                         sampler=SamplerState.create(params, VOCAB), stop_ids=frozenset(),
                         deliver=outcomes.put))
    return outcomes


def test_failing_step_is_logged_once_and_chained(
    scheduler: BatchScheduler, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="tito.engines"):
        outcome = _submit(scheduler, "boom-1").get(timeout=5)
    assert isinstance(outcome, EngineError)
    assert "embedded engine step failed" in str(outcome) and "kernel exploded" in str(outcome)
    assert isinstance(outcome.__cause__, RuntimeError)  # the cause chain reaches the gateway log
    records = [r for r in caplog.records if r.name.startswith("tito.engines")]
    assert len(records) == 1
    assert records[0].exc_info is not None and records[0].exc_info[0] is RuntimeError
    assert "boom-1" in records[0].getMessage()

    # The engine keeps serving: the next request fails the same way instead of hanging.
    outcome = _submit(scheduler, "boom-2").get(timeout=5)
    assert isinstance(outcome, EngineError) and "step 2" in str(outcome)
    assert scheduler.alive
    assert scheduler.snapshot()["running"] == 0
