"""The family matrix (docs/families.md is current and every family passes) and the
`tito verify-template` entry point (table, verdict, exit codes)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers.support import REPO, tokenizer_dir

from tito.cli import verify_template as verify_cli


def _matrix():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("family_matrix",
                                                  REPO / "scripts" / "family_matrix.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["family_matrix"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_family_matrix_has_no_regression_and_doc_is_current(capsys: pytest.CaptureFixture
                                                            ) -> None:
    tokenizer_dir("qwen3")  # skips without the fixtures
    rc = _matrix().main(["--check"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = (REPO / "docs" / "families.md").read_text()
    assert doc.count("| PASS |") >= 13


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    verify_cli.add_arguments(parser)
    return verify_cli.run(parser.parse_args(list(argv)))


def test_verify_template_cli_pass_fail_and_usage(capsys: pytest.CaptureFixture,
                                                 tmp_path: Path) -> None:
    qwen3 = tokenizer_dir("qwen3")
    assert _run("--tokenizer", str(qwen3), "--family", "qwen3", "--thinking", "off") == 0
    out = capsys.readouterr().out
    assert "verdict: PASS" in out and "token_prefix" in out
    # The original (unfixed) Qwen3 template fails: exit 1, the divergence is shown.
    assert _run("--tokenizer", str(qwen3), "--family", "default") == 1
    out = capsys.readouterr().out
    assert "verdict: FAIL" in out and "divergence" in out
    assert _run("--tokenizer", "standin", "--family", "glm47", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["checks"]["token_prefix"][0] > 0
    assert _run("--tokenizer", str(qwen3), "--family", "qwen3", "--kwargs", "[1]") == 2
    assert _run("--tokenizer", str(tmp_path), "--family", "qwen3") == 2


@pytest.mark.parametrize("family", [
    "minimax_m25",
    "minimax_m3",
    "gemma4",
])
def test_verify_template_standin_passes_for_new_families(family: str,
                                                         capsys: pytest.CaptureFixture) -> None:
    assert _run("--tokenizer", "standin", "--family", family, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["checks"]["token_prefix"][0] > 0
@pytest.mark.parametrize("family,kwargs", [
    ("inkling", '{"reasoning_effort": "low"}'),
    ("deepseek_v41", '{"reasoning_effort": "max"}'),
])
def test_verify_template_cli_on_a_standin_family(family: str, kwargs: str,
                                                 capsys: pytest.CaptureFixture) -> None:
    """``--tokenizer standin`` builds a family without a tokenizer file; it passes, also
    with its effort kwarg."""
    assert _run("--tokenizer", "standin", "--family", family, "--kwargs", kwargs,
                "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["checks"]["parse_round_trip"][0] > 0
