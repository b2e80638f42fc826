"""The embedded model's output head, shared with an otherwise idle second core.

The head (vocab x hidden: 49152 x 576 fp32, 113 MB) is a sixth of the weights a decode step
streams, in a single matmul. :class:`SplitHead` packs it as ``BLOCKS`` slices of the
vocabulary; the model's thread computes them from the first while a helper thread computes
them from the last, and the outputs are concatenated. Each slice is a block of output
columns of the same matmul, so the logits have the same bits as one call.

The helper runs at ``SCHED_IDLE`` priority: it only gets a core that nothing else wants (on
the 2-core box, the one that the gateway, the agents and the event loop leave idle at that
moment). On a busy machine it does not run and the model's thread computes every block
itself (the split costs a few more calls a step). The model's thread never waits
long for it: a block that the helper has claimed but not finished soon after the others
are done is computed again by the model's thread.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from collections.abc import Callable

import torch

Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

BLOCKS = 8
"""Vocabulary slices: small enough for the two threads to balance, few enough that the
extra calls cost nothing that matters."""

SCHED_IDLE: int | None = getattr(os, "SCHED_IDLE", None)  # Linux only


def split_head_available(threads: int) -> bool:
    """Whether a :class:`SplitHead` can help a model run with ``threads`` torch threads:
    idle priority exists, the model runs on one thread and another core is there to lend."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return SCHED_IDLE is not None and threads == 1 and cores >= 2


class _Job:
    """One head call: blocks claimed from the front by the caller, from the back by the
    helper."""

    def __init__(self, x: torch.Tensor, blocks: list[torch.Tensor], linear: Linear):
        self.x = x
        self.blocks = blocks
        self.linear = linear
        self.out: list[torch.Tensor | None] = [None] * len(blocks)
        self._first, self._last = 0, len(blocks) - 1  # the unclaimed blocks
        self._lock = threading.Lock()

    def claim(self, *, front: bool) -> int | None:
        with self._lock:
            if self._first > self._last:
                return None
            if front:
                self._first += 1
                return self._first - 1
            self._last -= 1
            return self._last + 1

    def run(self, i: int) -> None:
        self.out[i] = self.linear(self.x, self.blocks[i])

    def missing(self) -> list[int]:
        return [i for i, y in enumerate(self.out) if y is None]

    def result(self) -> torch.Tensor:
        blocks = [y for y in self.out if y is not None]
        if len(blocks) != len(self.out):
            raise RuntimeError("split head: a block is missing")
        return torch.cat(blocks, dim=-1)


def _stop(jobs: queue.SimpleQueue[_Job | None], thread: threading.Thread) -> None:
    """Stop and join the helper (at normal priority again, so that a busy machine cannot
    starve its exit): a thread that has run oneDNN work must be gone before the process
    tears down its C++ runtime."""
    if SCHED_IDLE is not None and thread.native_id is not None:
        try:
            os.sched_setscheduler(thread.native_id, os.SCHED_OTHER, os.sched_param(0))
        except OSError:  # already gone
            pass
    jobs.put(None)
    if thread is not threading.current_thread():
        thread.join(timeout=10)


def _helper(jobs: queue.SimpleQueue[_Job | None]) -> None:
    """The helper thread: takes blocks from the back of each job until told to stop."""
    if SCHED_IDLE is None:
        return
    try:
        os.sched_setscheduler(0, SCHED_IDLE, os.sched_param(0))
    except OSError:  # not allowed here: no helper
        return
    # This thread's OpenMP team: itself (torch's setting for new threads becomes 1 too,
    # which the engine's worker already uses when it lends a core, see split_head_available).
    torch.set_num_threads(1)
    with torch.inference_mode():
        while (job := jobs.get()) is not None:
            while (i := job.claim(front=False)) is not None:
                job.run(i)


class SplitHead:
    """``linear(x, head)`` for a head ``weight`` ``[vocab, hidden]``, computed by the
    calling thread and a helper thread at idle priority (see the module doc). ``pack``
    prepares a weight block for ``linear``. The helper stops on :meth:`close`, when this
    object is garbage-collected, or at exit."""

    def __init__(
        self, weight: torch.Tensor, pack: Callable[[torch.Tensor], torch.Tensor], linear: Linear
    ):
        self._blocks = [pack(block) for block in weight.chunk(BLOCKS)]
        self._linear = linear
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # The thread holds the queue only, so that this object can be collected.
        self._thread = threading.Thread(target=_helper, args=(self._jobs,),
                                        name="tito-embedded-head", daemon=True)
        self._thread.start()
        self._stop = weakref.finalize(self, _stop, self._jobs, self._thread)  # also at exit

    def close(self) -> None:
        """Stop the helper; later calls compute every block on the calling thread."""
        self._stop()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        job = _Job(x, self._blocks, self._linear)
        if self._thread.is_alive() and self._stop.alive:
            self._jobs.put(job)
        start, done = time.perf_counter(), 0
        while (i := job.claim(front=True)) is not None:
            job.run(i)
            done += 1
        # The helper may still be on its last block: wait about one block's time for it.
        now = time.perf_counter()
        deadline = now + 1.5 * (now - start) / max(done, 1)
        while job.missing() and time.perf_counter() < deadline:
            time.sleep(0)
        for i in job.missing():  # claimed by a helper that has not run since
            job.run(i)
        return job.result()
