#!/usr/bin/env bash
# The whole test suite: install, lint, test. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export HF_HUB_OFFLINE=1
python3 -m ruff check .
python3 -m pytest -q "$@"
