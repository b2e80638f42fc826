"""``tito serve`` configuration errors: exit 2 with one clear line, checked in-process
(nothing starts: the flags are validated before the engine is built)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tito.cli import main


@pytest.mark.parametrize(("flags", "message"), [
    (["--engine", "sglang"], "--engine sglang needs --engine-url"),
    (["--engine-url", "http://127.0.0.1:1"], "--tokenizer is required with --engine sglang"),
    (["--engine", "embedded", "--tokenizer", "."], "--tokenizer is not used with --engine"),
    (["--engine", "embedded", "--engine-url", "http://x"], "--engine-url is only used"),
    (["--engine-url", "http://x", "--tokenizer", ".", "--chat-template", "t.jinja",
      "--family", "qwen3"], "--chat-template is only allowed with --family default"),
    (["--engine-url", "http://x", "--tokenizer", ".", "--max-seq-len", "1"],
     "--max-seq-len must be at least 2"),
    (["--engine-url", "http://x", "--tokenizer", ".", "--keepalive-timeout", "0"],
     "--keepalive-timeout must be above 0"),
    (["--engine-url", "http://x", "--tokenizer", "/nonexistent"], "does not exist"),
    (["--engine-url", "http://x", "--tokenizer", "{qwen3}", "--family", "qwen3",
      "--message-matcher", "nope"], "unknown message matcher 'nope'"),
    (["--engine-url", "http://x", "--tokenizer", "{qwen3}", "--family", "qwen3",
      "--message-matcher", "tito_no_such:fn"], "cannot load message matcher"),
    (["--engine-url", "http://x", "--tokenizer", ".", "--allowed-origins", "*,ftp://x"],
     "--allowed-origins 'ftp://x' is not an origin"),
    (["--engine-url", "http://x", "--tokenizer", ".", "--max-nodes", "8"],
     "--max-nodes is a v2 option"),
    (["--engine-url", "http://x", "--tokenizer", ".", "--sample-picker", "a.b"],
     "--sample-picker is a v2 option"),
    (["--engine-url", "http://x", "--tokenizer", ".", "--session-version", "v2",
      "--max-rollback", "3"], "--max-rollback is a v1 option"),
    (["--engine-url", "http://x", "--tokenizer", "{qwen3}", "--family", "qwen3",
      "--session-version", "v2", "--sample-picker", "helpers.v2_hooks:async_pick"],
     "--sample-picker 'helpers.v2_hooks:async_pick' must be a plain function, not async"),
    (["--engine-url", "http://x", "--tokenizer", "{qwen3}", "--family", "qwen3",
      "--session-version", "v2", "--sample-postprocessor", "helpers.v2_hooks:nothing"],
     "cannot load --sample-postprocessor 'helpers.v2_hooks:nothing'"),
])
def test_bad_flags_exit_2(flags: list[str], message: str, qwen3_dir: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    flags = [f.replace("{qwen3}", str(qwen3_dir)) for f in flags]
    assert main(["serve", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    [line] = err.strip().splitlines()
    assert line.startswith("tito serve: ") and message in line, err


def test_port_in_use_exits_2(capsys: pytest.CaptureFixture[str], qwen3_dir: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--engine-url", "http://x", "--tokenizer", str(qwen3_dir),
                     "--family", "qwen3", "--port", str(port)])
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "serve" in capsys.readouterr().out


def test_strict_template_refuses_to_start(qwen3_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The original Qwen3 template is not append-only: --strict-template refuses it (exit 2,
    checked in-process: nothing is served)."""
    code = main(["serve", "--engine-url", "http://127.0.0.1:1", "--tokenizer", str(qwen3_dir),
                 "--family", "default", "--strict-template", "--port", "0"])
    assert code == 2
    assert "failed the append-only self-check" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "rule"), [
    ([], "keep"),
    (["--compat", "miles"], "refuse"),
    (["--compat", "miles", "--after-length-cut", "keep"], "keep"),
    (["--after-length-cut", "refuse"], "refuse"),
])
def test_compat_miles_refuses_turns_after_a_length_cut(flags: list[str], rule: str) -> None:
    """``--compat miles`` takes the reference's rule unless the flag says otherwise."""
    from tito.cli import build_parser
    from tito.cli.serve import config_from_args

    args = build_parser("serve").parse_args(
        ["serve", "--engine-url", "http://x", "--tokenizer", ".", *flags])
    assert config_from_args(args).after_length_cut == rule
