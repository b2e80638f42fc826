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
:func:`one_malloc_arena` keeps every thread's ``malloc`` in the main arena. The gateway's
startup runs partly in threads (the engine client and the fast encoder's tables are built
off the event loop); with glibc's default of one arena per thread, what those threads
allocate and free stays in arenas the event loop's thread never uses, resident and idle.
In one arena the sessions reuse that freed memory first: a fixed saving, not a per-token
one (``benchmarks/memory.py``: RSS after 1,000 sessions 421 against 350 MiB, which that
benchmark's growth figure shows as 21.1 against 16.3 bytes per stored token). The
threads rarely run Python at once (the GIL), and most of their ``malloc`` calls are
served by glibc's per-thread caches, so one lock costs nothing measurable. ``tito
serve`` with the embedded engine keeps glibc's default: its model's threads allocate
tensors in parallel.

All three are process-wide, so only a server's entry point calls them, never a library
call or a test process. Measured with ``python benchmarks/gateway_overhead.py`` and
``python benchmarks/memory.py`` (docs/performance.md).
"""

from __future__ import annotations

import ctypes
import gc
import sys

YOUNG_THRESHOLD = 50_000
"""Net container allocations between young collections (CPython's default: 700). Cyclic
garbage waits at most this many allocations longer to be freed. Most of what a turn
allocates dies before the next collection and is never walked: 50,000 against 10,000
cut the gateway's instructions per turn by 1.9% (``benchmarks/gateway_instructions.py``);
a young collection then walks at most the objects of the turns in flight."""


M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter for the most arenas (``malloc.h``)."""


def one_malloc_arena() -> bool:
    """Limit glibc ``malloc`` to one arena (``MALLOC_ARENA_MAX=1``) before the first
    thread starts. False where there is no glibc (the call is skipped)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (musl has mallopt but ignores this one)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, 1))


def tune_for_serving() -> None:
    """Young collections every :data:`YOUNG_THRESHOLD` net allocations (older generations
    keep their default ratios)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def freeze_startup_heap() -> None:
    """Collect once, then leave every object alive now out of all later collections."""
    gc.collect()
    gc.freeze()
