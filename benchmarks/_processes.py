"""The benchmarks' server processes (mock engine, gateway, pass-through proxy, all run from
the tree under test) and the probes read from ``/proc``: CPU time and RSS.

CPU time is read from ``/proc/<pid>/task/*/schedstat`` (nanoseconds of on-CPU time, every
thread of the process) rather than ``/proc/<pid>/stat``, whose 10 ms clock ticks are too
coarse for a per-turn figure (docs/performance.md gives the current ones).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _paths import REPO

from tito import launch
from tito.launch import ServerProcess

Proc = ServerProcess


def _from_root() -> dict[str, Any]:
    """Launch options that run the tree under test (``TITO_BENCH_ROOT``, default this one)."""
    root = tito_root()
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    return {"cwd": root, "env": {"PYTHONPATH": path}, "timeout": 120.0}


def start_server(name: str, cmd: Sequence[str], *, health: str = "/health") -> Proc:
    """Start ``cmd`` from the tree under test."""
    return launch.start_server(name, cmd, health=health, **_from_root())


def tito_root() -> Path:
    """The tree whose ``tito`` the servers run: ``TITO_BENCH_ROOT`` (an A/B copy) or this repo."""
    return Path(os.environ.get("TITO_BENCH_ROOT", REPO)).resolve()


def start_mock(tokenizer: Path, *, latency_ms: float = 0.0, token_latency_ms: float = 0.0,
               log_size: int = 8, extra: tuple[str, ...] = ()) -> Proc:
    return launch.start_mock_engine(
        tokenizer, "qwen3", "--latency-ms", str(latency_ms), "--token-latency-ms",
        str(token_latency_ms), "--request-log-size", str(log_size), "--log-level", "warning",
        *extra, **_from_root())


def start_gateway(tokenizer: Path, engine_url: str, *extra: str) -> Proc:
    """``tito serve`` once its fast encoder is built (its background build would otherwise
    be counted as gateway CPU of the first timed run)."""
    gateway = launch.start_gateway(engine_url, tokenizer, "qwen3", "--log-level", "warning",
                                   *extra, **_from_root())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with urllib.request.urlopen(gateway.url + "/health", timeout=5) as reply:
            caps = json.loads(reply.read()).get("capabilities", {})
        if caps.get("fast_encoder_state") != "building":
            break
        time.sleep(0.05)
    return gateway


def start_passthrough(engine_url: str) -> Proc:
    script = Path(__file__).resolve().parent / "passthrough_proxy.py"
    return start_server("pass-through proxy", [sys.executable, str(script), "--upstream",
                                               engine_url, "--port", "0"])


# -- probes ------------------------------------------------------------------------------
def cpu_ns(pid: int) -> int:
    """On-CPU nanoseconds of every live thread of ``pid`` (schedstat; ticks as a fallback)."""
    total = 0
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tasks = list(task_dir.iterdir())
    except FileNotFoundError:
        return 0
    ok = False
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
            ok = True
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
    if ok:
        return total
    import psutil  # no schedstat (kernel without CONFIG_SCHED_INFO): 10 ms ticks

    t = psutil.Process(pid).cpu_times()
    return int((t.user + t.system) * 1e9)


def busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``, all cores)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def rss_bytes(pid: int) -> int:
    return _status_kb(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int) -> int:
    """High-water mark of the resident set (``VmHWM``)."""
    return _status_kb(pid, "VmHWM") * 1024


def http_json(method: str, url: str, body: bytes | None = None, timeout: float = 60) -> Any:
    import orjson

    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    return orjson.loads(raw) if raw else None

