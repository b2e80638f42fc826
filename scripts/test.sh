#!/usr/bin/env bash
# The whole test suite: install, lint, type-check, test. `.ci/run` calls exactly this.
# Extra arguments go to pytest; the fast tier (no model, no benchmarks, no process-per-family
# runs; under a minute) is: python3 -m pytest -m "not slow" -n 2
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export HF_HUB_OFFLINE=1
python3 -m ruff check .
python3 -m mypy
python3 -m pytest -q "$@"
