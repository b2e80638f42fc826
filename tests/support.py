"""Test support: paths to ../shared fixtures and real `tito` subprocesses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TITO_SHARED_DIR", REPO.parent / "shared"))
TOKENIZERS = SHARED / "fixtures" / "tokenizers"


def tokenizer_dir(name: str) -> Path:
    """A fixture tokenizer folder, or skip the test with the reason."""
    path = TOKENIZERS / name
    if not path.is_dir():
        pytest.skip(f"needs ../shared/fixtures/tokenizers/{name} (absent: {path})")
    return path


@dataclass
class Proc:
    """A `tito` subprocess that printed `... listening on http://HOST:PORT`."""

    process: subprocess.Popen[str]
    url: str
    lines: list[str]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_LISTEN = re.compile(r"listening on (http://\S+)")


def start_tito(*args: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> Proc:
    """Run ``python -m tito.cli ARGS`` and wait until it reports its URL and /health is 200."""
    cmd = [sys.executable, "-m", "tito.cli", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    lines: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if not found and (m := _LISTEN.search(line)):
                found.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    ready.wait(timeout)
    if not found:
        proc.kill()
        raise RuntimeError(f"{' '.join(cmd)} did not start:\n" + "\n".join(lines[-40:]))
    url = found[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return Proc(proc, url, lines)
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{' '.join(cmd)} never became healthy:\n" + "\n".join(lines[-40:]))
