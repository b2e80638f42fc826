"""Collector settings of a server process (tito.heap), in a fresh interpreter: they are
process-wide, so this test process is left as it is."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import gc
from tito.heap import YOUNG_THRESHOLD, freeze_startup_heap, tune_for_serving
before = gc.get_threshold()
tune_for_serving()
after = gc.get_threshold()
assert after == (YOUNG_THRESHOLD, before[1], before[2]), (before, after)
assert gc.get_freeze_count() == 0
kept = [[i] for i in range(1000)]
freeze_startup_heap()
assert gc.get_freeze_count() >= 1000, gc.get_freeze_count()
young = [[i] for i in range(10)]
assert all(gc.is_tracked(x) for x in young)
assert len(gc.get_objects()) < 100, len(gc.get_objects())  # the frozen heap is not walked
print("ok")
"""


def test_serving_settings_make_young_collections_rarer_and_freeze_the_startup_heap() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


ARENAS = """
import ctypes, sys, threading
from tito.heap import one_malloc_arena
if sys.argv[1] == "one":
    assert one_malloc_arena()
held = []
def work():
    held.append([bytearray(200_000 + i) for i in range(20)])  # malloc, not pymalloc
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc arenas")
def test_one_malloc_arena_keeps_every_thread_in_the_main_arena() -> None:
    def arenas(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", ARENAS, mode], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stderr.count("Arena ")

    assert arenas("default") > 1  # glibc's default: the threads get arenas of their own
    assert arenas("one") == 1
