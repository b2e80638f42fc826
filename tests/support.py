"""Test support: paths to ../shared fixtures and real `tito` subprocesses.

Process tests start ``tito mock-engine`` and ``tito serve`` through :mod:`tito.launch`
(the same functions the benchmarks and the stack builder use).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tito import launch
from tito.launch import ServerProcess, start_server, tito_command

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TITO_SHARED_DIR", REPO.parent / "shared"))
TOKENIZERS = SHARED / "fixtures" / "tokenizers"

Proc = ServerProcess


def tokenizer_dir(name: str) -> Path:
    """A fixture tokenizer folder, or skip the test with the reason."""
    path = TOKENIZERS / name
    if not path.is_dir():
        pytest.skip(f"needs ../shared/fixtures/tokenizers/{name} (absent: {path})")
    return path


def start_tito(*args: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> Proc:
    """Run ``python -m tito.cli ARGS`` from the repo; wait for its URL and a healthy /health."""
    return start_server(f"tito {args[0]}", tito_command(*args), cwd=REPO, env=env,
                        timeout=timeout)


def start_mock(tokenizer: str | Path, family: str, *extra: str) -> Proc:
    """``tito mock-engine`` on a free port (from the repo, like a user would run it)."""
    return launch.start_mock_engine(tokenizer, family, *extra, cwd=REPO, timeout=60.0)


def start_gateway(engine_url: str, tokenizer: str | Path, family: str, *extra: str) -> Proc:
    """``tito serve --engine sglang`` on a free port, in front of ``engine_url``."""
    return launch.start_gateway(engine_url, tokenizer, family, *extra, cwd=REPO, timeout=60.0)
