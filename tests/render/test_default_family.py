"""The ``default`` family reads its thinking switch and its end-of-turn marker off the
template: ``--thinking off`` and ``--kwargs`` reach the verifier's prefix checks, and the
stop token is the template's own marker (or ``--stop-token``), not only the EOS of
tokenizer_config.json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from helpers.support import REPO, tokenizer_dir

from tito.cli import verify_template as verify_cli
from tito.render import build_renderer
from tito.render.verify import verify_renderer

QWEN3_TEMPLATE = REPO / "tito" / "render" / "templates" / "qwen3.jinja"
"""Our append-only Qwen3 template (it needs ``clear_thinking=False``)."""
KEEP = {"clear_thinking": False}


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    verify_cli.add_arguments(parser)
    return verify_cli.run(parser.parse_args(list(argv)))


def test_thinking_off_runs_the_prefix_checks() -> None:
    renderer = build_renderer("default", tokenizer_dir("qwen3"), chat_template=QWEN3_TEMPLATE)
    assert renderer.spec.thinking_kwarg == "enable_thinking"
    for report in (verify_renderer(renderer, thinking="off", kwargs=KEEP),
                   verify_renderer(renderer, kwargs={**KEEP, "enable_thinking": False})):
        assert report.passed, report.summary()
        assert len(report.variants) == 1 and "enable_thinking=False" in report.variants[0]
        assert report.checks()["text_prefix"][1] >= 10
        assert report.checks()["token_prefix"][1] >= 10
        assert "render" not in report.checks()


def _eos_endoftext(tmp_path: Path) -> Path:
    """qwen3's tokenizer with a base model's tokenizer_config.json (EOS <|endoftext|>)."""
    source = tokenizer_dir("qwen3")
    (tmp_path / "tokenizer.json").symlink_to(source / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|endoftext|>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_stop_token_is_the_templates_end_marker(tmp_path: Path) -> None:
    folder = _eos_endoftext(tmp_path)
    renderer = build_renderer("default", folder, chat_template=QWEN3_TEMPLATE)
    assert renderer.stop_texts == ("<|im_end|>", "<|endoftext|>")
    report = verify_renderer(renderer, kwargs=KEEP)
    assert report.passed, report.summary()


def test_stop_token_flag(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = str(_eos_endoftext(tmp_path))
    kwargs = json.dumps(KEEP)
    assert _run("--tokenizer", folder, "--family", "default", "--template",
                str(QWEN3_TEMPLATE), "--kwargs", kwargs, "--stop-token", "<|im_end|>",
                "--json") == 0
    assert json.loads(capsys.readouterr().out)["passed"]
    # another stop token than the template's marker: the turns do not close as rendered
    assert _run("--tokenizer", folder, "--family", "default", "--template",
                str(QWEN3_TEMPLATE), "--kwargs", kwargs, "--stop-token", "<|endoftext|>",
                "--json") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["first_failure_reason"] in ("truncated_without_close",
                                              "unknown_closing_sequence")
    assert _run("--tokenizer", folder, "--family", "default", "--stop-token", "<|nope|>") == 2
    assert "not a token" in capsys.readouterr().out
    assert _run("--tokenizer", folder, "--family", "qwen3", "--stop-token", "<|im_end|>") == 2
    assert "only allowed with family 'default'" in capsys.readouterr().out
