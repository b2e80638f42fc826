"""Claude Code (the real CLI, pinned in scripts/harness_clis.sh) runs scripted tasks
against ``tito serve`` over the mock engine, in a network namespace of its own with
loopback alone; every model call it makes must be committed and in the samples, with no
TITO violation. Cases the gateway fails today are xfail(strict) with the exact cause.

Skips without npm and the installed CLI (``bash scripts/harness_clis.sh``) or without
``unshare``. What the CLI sends: /work/notes/cli-findings.md and tests/harnesses/fixtures/.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli_scenarios import CLAUDE, Scenario, check_run, run_scenario, scenario_params

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scenario", scenario_params(CLAUDE))
def test_claude_code(scenario: Scenario, tmp_path: Path) -> None:
    check_run(scenario, run_scenario(scenario, tmp_path))
