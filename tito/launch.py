"""Starting our HTTP servers as child processes (the stack's mock engine, tests, benchmarks).

Every server of ours prints ``<name> listening on http://HOST:PORT`` once it accepts
connections (see :func:`tito.net.serve_forever`), so a caller can ask for ``--port 0`` and
learn the port from that line. :func:`start_mock_engine` and :func:`start_gateway` are the
one way to start ``tito mock-engine`` and ``tito serve`` processes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LISTEN_LINE = re.compile(r"listening on (http://\S+)")


@dataclass
class ServerProcess:
    """A server child process that announced its URL; ``lines`` is its recent output."""

    name: str
    process: subprocess.Popen[str]
    url: str
    lines: list[str]

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def tito_command(*args: str) -> list[str]:
    """``python -m tito.cli ARGS`` with this interpreter."""
    return [sys.executable, "-m", "tito.cli", *args]


def start_server(name: str, cmd: Sequence[str], *, cwd: str | Path | None = None,
                 env: dict[str, str] | None = None, health: str = "/health",
                 timeout: float = 120.0, own_session: bool = False,
                 echo: str | None = None) -> ServerProcess:
    """Start ``cmd``, wait for its ``listening on URL`` line and a 200 (or 503: up, its
    engine down) on ``health``.

    ``own_session``: run it in a new session (process group), so a Ctrl-C in the terminal
    reaches only us and we decide when it stops. ``echo``: also copy its output to our
    stderr, each line prefixed with ``echo``. Raises RuntimeError with the process's
    last output lines when it does not come up.
    """
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=cwd, env=full_env, start_new_session=own_session)
    lines: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if echo is not None and not LISTEN_LINE.search(line):  # ours is the line
                sys.stderr.write(f"{echo}{line}")
            if len(lines) > 2000:
                del lines[:1000]
            if not found and (m := LISTEN_LINE.search(line)):
                found.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    ready.wait(timeout)
    if not found:
        proc.kill()
        raise RuntimeError(f"{name} did not start:\n" + "\n".join(lines[-40:]))
    url = found[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _serving(url + health):
            return ServerProcess(name, proc, url, lines)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{name} never became healthy:\n" + "\n".join(lines[-40:]))


def _serving(url: str) -> bool:
    """A 200 — or a 503: serving, with its engine down (the gateway's "degraded")."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError as exc:
        return exc.code == 503
    except (urllib.error.URLError, OSError):
        return False


def start_mock_engine(tokenizer: str | Path, family: str, *extra: str,
                      **options: Any) -> ServerProcess:
    """``tito mock-engine --tokenizer T --family F --port 0 EXTRA`` (``options``: see
    :func:`start_server`)."""
    return start_server("tito mock-engine", tito_command(
        "mock-engine", "--tokenizer", str(tokenizer), "--family", family, "--host",
        "127.0.0.1", "--port", "0", *extra), **options)


def start_gateway(engine_url: str, tokenizer: str | Path, family: str, *extra: str,
                  **options: Any) -> ServerProcess:
    """``tito serve --engine sglang --engine-url URL --tokenizer T --family F --port 0 EXTRA``."""
    return start_server("tito serve", tito_command(
        "serve", "--engine", "sglang", "--engine-url", engine_url, "--tokenizer",
        str(tokenizer), "--family", family, "--host", "127.0.0.1", "--port", "0", *extra),
        **options)
