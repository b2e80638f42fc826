"""Runnable examples: the demo calculator agent, a scripted agent for the mock engine and
the bundled ``arithmetic.jsonl`` dataset that ``tito rollout`` uses by default."""

from __future__ import annotations

from pathlib import Path

EXAMPLES_DIR = Path(__file__).resolve().parent
ARITHMETIC_DATA = EXAMPLES_DIR / "arithmetic.jsonl"
"""32 arithmetic and unit-conversion questions; ``metadata.answer`` holds the number."""

DEMO_AGENT = "tito.examples.calculator_agent:run_agent"
"""The ``--agent`` that ``tito rollout`` runs by default."""

__all__ = ["ARITHMETIC_DATA", "DEMO_AGENT", "EXAMPLES_DIR"]
