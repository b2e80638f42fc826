"""Profiling a server process with py-spy, and reading its raw output back."""

from __future__ import annotations

import re
import subprocess
import time
from collections import Counter
from pathlib import Path


class PySpy:
    """``py-spy record --gil`` attached to a process (samples only while it holds the GIL, so
    time blocked in syscalls or idle in epoll is left out: a view of Python CPU)."""

    RATE = 400
    """Samples per second."""

    def __init__(self, pid: int, out: Path, rate: int = RATE) -> None:
        import shutil

        exe = shutil.which("py-spy")
        if exe is None:
            raise SystemExit("--py-spy needs py-spy on PATH (pip install py-spy)")
        self.out = out
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--rate", str(rate), "--gil", "--nonblocking",
             "--format", "raw", "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # attach before the load starts

    def stop(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            err = ""
        if not self.out.is_file():
            raise SystemExit(f"py-spy wrote no profile (needs ptrace rights): {err[-500:]}")


_LINE_NO = re.compile(r":\d+\)$")


def top_frames(collapsed: Path, n: int = 15) -> tuple[list[list[str]], list[list[str]]]:
    """(top self frames, top inclusive ``tito/`` frames) of py-spy raw output, in % of samples."""
    from collections import Counter

    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        frames = [_LINE_NO.sub(")", f) for f in stack.split(";")]  # per function, not line
        total += k
        own[frames[-1]] += k
        for frame in set(frames):
            if "tito/" in frame and "tito/cli.py" not in frame and "main.py" not in frame:
                incl[frame] += k

    def pct(c: int) -> str:
        return f"{100 * c / max(1, total):.1f}%"

    return ([[f, pct(c)] for f, c in own.most_common(n)],
            [[f, pct(c)] for f, c in incl.most_common(n)])


_FRAME_FILE = re.compile(r"\(([^()]*)\)$")


def by_package(collapsed: Path, n: int = 12) -> list[list[str]]:
    """Self samples grouped by the package of the sampled frame (tito: by subpackage), in %."""
    groups = package_samples(collapsed)
    total = sum(groups.values())
    return [[k, f"{100 * c / max(1, total):.1f}%"] for k, c in groups.most_common(n)]


def package_samples(collapsed: Path) -> Counter[str]:
    """Self samples of py-spy raw output by the package of the sampled frame (tito: by
    subpackage)."""
    groups: Counter[str] = Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        match = _FRAME_FILE.search(stack.split(";")[-1])
        path = match.group(1) if match else "?"
        if path.startswith("tito/render/tokenizer.py"):
            key = "tokenizers (encode/decode)"
        elif path.startswith("tito/"):
            key = "tito/" + path.split("/")[1]
        elif path.startswith("<template>"):
            key = "jinja2 (template code)"
        else:
            key = re.split(r"[/.:]", path, maxsplit=1)[0] or "?"
        groups[key] += int(count)
    return groups

