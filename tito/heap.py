"""Garbage-collector settings for a long-running server process (``tito serve``).

CPython's cyclic collector runs a young collection every 700 net container allocations,
and each one walks every young object still alive. A gateway under load keeps thousands
of them alive at any moment (the coroutines, handles and buffers of its in-flight turns),
so with the default threshold about 9% of its CPU went to collections that free almost
nothing: nearly everything a turn allocates is freed by reference counting, and the cyclic
garbage of a whole benchmark run was 225 objects. Full collections also walked the
startup heap (templates, tokenizer tables, modules: about 68,000 objects) every time.

:func:`tune_for_serving` makes young collections rarer (:data:`YOUNG_THRESHOLD`);
:func:`freeze_startup_heap` moves what is alive after startup out of every later
collection (``gc.freeze``; reference counting still frees those objects, only cycles
among them would outlive their use).
Both are process-wide, so only a server's entry point calls them, never a library call or
a test process. Measured with ``python benchmarks/gateway_overhead.py`` (docs/performance.md).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net container allocations between young collections (CPython's default: 700). Cyclic
garbage waits at most this many allocations longer to be freed. Most of what a turn
allocates dies before the next collection and is never walked: 50,000 against 10,000
cut the gateway's instructions per turn by 1.9% (``benchmarks/gateway_instructions.py``);
a young collection then walks at most the objects of the turns in flight."""


def tune_for_serving() -> None:
    """Young collections every :data:`YOUNG_THRESHOLD` net allocations (older generations
    keep their default ratios)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def freeze_startup_heap() -> None:
    """Collect once, then leave every object alive now out of all later collections."""
    gc.collect()
    gc.freeze()
