"""Collector settings of a server process (tito.heap), in a fresh interpreter: they are
process-wide, so this test process is left as it is."""

from __future__ import annotations

import subprocess
import sys

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
