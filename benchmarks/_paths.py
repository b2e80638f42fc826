"""Where the benchmarks find the tree under test and its fixtures.

The benchmarks are scripts (``python benchmarks/NAME.py``); their helpers sit next to them,
one topic a module, imported by name: ``_paths`` (this one), ``_processes`` (servers and
their CPU/RSS probes), ``_workload`` (the conversation a session plays), ``_load`` (the
load generator), ``_profiling`` (py-spy) and ``_tables`` (statistics and printed tables).
Nothing in them is timed itself. Importing any of them puts this repository on
``sys.path``, so a checkout without ``pip install -e .`` runs its own ``tito``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TITO_SHARED_DIR", REPO.parent / "shared"))
QWEN3_DIR = SHARED / "fixtures" / "tokenizers" / "qwen3"
if str(REPO) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))
