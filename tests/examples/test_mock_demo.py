"""The mock demo runs end to end and prints a completed 3-turn sample."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a child process + the stack


def test_mock_demo_prints_a_completed_three_turn_sample(qwen3_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tito.examples.mock_demo", "--tokenizer",
                           str(qwen3_dir), "--family", "qwen3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"turns": 3,
                                                                "status": "completed"}
    assert "'strict_mismatches': []" in proc.stdout
