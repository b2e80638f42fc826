"""Test support: paths to ../shared fixtures and real `tito` subprocesses.

Process tests start ``tito mock-engine`` and ``tito serve`` through :mod:`tito.launch`
(the same functions the benchmarks and the stack builder use).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tito import launch
from tito.launch import ServerProcess, start_server, tito_command
from tito.samples import Sample, decode_samples

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("TITO_SHARED_DIR", REPO.parent / "shared"))
TOKENIZERS = SHARED / "fixtures" / "tokenizers"

Proc = ServerProcess


EXAMPLES_SCALE = "TITO_EXAMPLES_SCALE"
"""Multiplies the example count of every property test that asks :func:`examples`: the
fast tier (``-m "not slow"``) sets it to 0.25 unless it is set (conftest.py); the full
suite runs every count in full."""


def examples(n: int) -> int:
    """Hypothesis ``max_examples`` for a property test worth ``n`` in the full suite."""
    return max(10, round(n * float(os.environ.get(EXAMPLES_SCALE, "1"))))


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


# -- talking to a gateway over the mock engine ------------------------------------------------
def new_session(url: str) -> str:
    """A new session on the gateway at ``url`` (its 32-hex-digit id)."""
    resp = httpx.post(url + "/sessions")
    assert resp.status_code == 200, resp.text
    sid = str(resp.json()["session_id"])
    assert len(sid) == 32 and int(sid, 16) >= 0
    return sid


def engine_log(engine_url: str, session: str | None = None) -> list[dict[str, Any]]:
    """The mock engine's request log (only ``session``'s requests when given)."""
    log = list(httpx.get(engine_url + "/mock/requests").json())
    return log if session is None else [e for e in log if e["rid"].startswith(session)]


def assert_tito_chain(log: list[dict[str, Any]], trim: int = 0) -> None:
    """Every request's prompt extends the previous one's prompt + output (less ``trim``)."""
    for prev, cur in itertools.pairwise(log):
        stored = prev["input_ids"] + prev["output_ids"]
        stored = stored[: len(stored) - trim] if trim else stored
        assert cur["input_ids"][: len(stored)] == stored, "TITO invariant broken"


def bare_sample(url: str, sid: str) -> Sample:
    """The session's one sample without its metadata (ids and timings differ between
    sessions), for bit-for-bit comparisons."""
    resp = httpx.post(f"{url}/sessions/{sid}/samples", json={})
    assert resp.status_code == 200, resp.text
    (sample,) = decode_samples(resp.content).samples
    return dataclasses.replace(sample, metadata={})
