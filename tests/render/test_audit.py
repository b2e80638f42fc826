"""The audit corpus: every conversation runs for a family that allows its appended roles,
the others are skipped by that declared capability (not failed), and verify-template runs
it unless --no-audit."""

from __future__ import annotations

import argparse
import json

import pytest
from helpers.support import tokenizer_dir

from tito.cli import verify_template as verify_cli
from tito.render import build_renderer
from tito.render.audit import FORMAT_LIMITS, audit_corpus
from tito.render.families import family_module
from tito.render.verify import verify_renderer


def _names(report_cases: list[object]) -> set[str]:
    return {c.trajectory for c in report_cases}  # type: ignore[attr-defined]


def test_corpus_covers_every_junction() -> None:
    corpus = {c.name: c for c in audit_corpus()}
    roles = set().union(*(c.appends for c in corpus.values()))
    assert roles == {"assistant", "system", "tool", "user"}
    calls = [len(m.get("tool_calls") or []) for c in corpus.values() for m in c.messages]
    assert max(calls) >= 3  # parallel calls
    tool_outputs = [len(m["content"]) for c in corpus.values() for m in c.messages
                    if m["role"] == "tool"]
    assert max(tool_outputs) > 5000 and min(tool_outputs) == 0  # long and empty outputs


def test_qwen3_runs_every_conversation_and_passes() -> None:
    renderer = build_renderer("qwen3", tokenizer_dir("qwen3"))
    report = verify_renderer(renderer, pool=[], audit=True)
    assert report.passed, report.summary()
    assert report.skipped == []
    assert _names(report.cases) == {f"audit/{c.name}" for c in audit_corpus()}


def test_a_family_without_system_appends_skips_by_capability() -> None:
    renderer = build_renderer("minimax_m2", "standin")
    assert "system" not in renderer.allowed_append_roles
    report = verify_renderer(renderer, pool=[], audit=True)
    assert report.passed, report.summary()
    needs_system = {f"audit/{c.name}" for c in audit_corpus() if "system" in c.appends}
    assert needs_system and set(report.skipped) == needs_system
    assert not needs_system & _names(report.cases)


@pytest.mark.slow  # loads the Qwen3.5 tokenizer
@pytest.mark.skipif(not FORMAT_LIMITS, reason="no family declares a format limit")
@pytest.mark.parametrize("family", sorted(FORMAT_LIMITS))
def test_declared_format_limits_are_real(family: str) -> None:
    """A declared limit is a parse failure the verifier really sees (none stale)."""
    fixture = getattr(family_module(family), "FIXTURE", None)
    renderer = build_renderer(family, tokenizer_dir(fixture) if fixture else "standin")
    report = verify_renderer(renderer, thinking="on", pool=[], audit=True)
    failed = {c.trajectory for c in report.cases if not c.passed}
    assert failed == set(FORMAT_LIMITS[family])
    assert {c.check for c in report.cases if not c.passed} == {"parse_round_trip"}


def test_verify_template_runs_the_corpus(capsys: pytest.CaptureFixture) -> None:
    def run(*argv: str) -> dict[str, object]:
        parser = argparse.ArgumentParser()
        verify_cli.add_arguments(parser)
        assert verify_cli.run(parser.parse_args(list(argv))) == 0
        return dict(json.loads(capsys.readouterr().out))

    full = run("--tokenizer", "standin", "--family", "minimax_m2", "--json")
    lean = run("--tokenizer", "standin", "--family", "minimax_m2", "--json", "--no-audit")
    assert full["skipped"] == ["audit/system_mid_conversation", "audit/tool_then_system"]
    assert lean["skipped"] == []
    assert full["checks"]["token_prefix"][1] > lean["checks"]["token_prefix"][1]  # type: ignore[index]
