#!/usr/bin/env bash
# The whole test suite: install, lint, type-check, test. `.ci/run` calls exactly this.
# Extra arguments go to pytest; the fast tier (no model, no benchmarks, no process-per-family
# runs; under a minute) is: python3 -m pytest -m "not slow" -n 2
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# The agent CLI tests (tests/harnesses/test_claude_code.py, test_codex.py) drive the real
# Claude Code and Codex CLIs, installed here when npm exists (about 10 s the first time,
# 0.2 s after; ~800 MB in ~/.cache/tito/npm); without npm or the registry they skip.
if command -v npm >/dev/null 2>&1; then
    bash scripts/harness_clis.sh >/dev/null ||
        echo "test.sh: agent CLIs not installed (tests/harnesses CLI tests will skip)" >&2
fi
export HF_HUB_OFFLINE=1
python3 -m ruff check .
python3 -m mypy
python3 -m pytest -q "$@"
