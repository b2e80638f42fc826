"""Shared fixtures (helpers live in support.py, importable from every test module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Proc, start_tito, tokenizer_dir


@pytest.fixture(scope="session")
def qwen3_dir() -> Path:
    return tokenizer_dir("qwen3")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return tokenizer_dir("smollm2")


@pytest.fixture(scope="module")
def qwen3_stack(qwen3_dir: Path) -> Iterator[tuple[Proc, Proc]]:
    """`tito mock-engine` + `tito serve` for qwen3, as real processes on ephemeral ports."""
    engine = start_tito("mock-engine", "--tokenizer", str(qwen3_dir), "--family", "qwen3",
                        "--port", "0")
    try:
        gateway = start_tito("serve", "--engine", "sglang", "--engine-url", engine.url,
                             "--tokenizer", str(qwen3_dir), "--family", "qwen3", "--port", "0",
                             "--max-body-bytes", "2000000")
    except Exception:
        engine.stop()
        raise
    try:
        yield engine, gateway
    finally:
        gateway.stop()
        engine.stop()
