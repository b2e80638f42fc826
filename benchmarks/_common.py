"""Shared helpers of the benchmarks: processes, CPU/RSS probes, workloads, load generator.

The benchmarks are scripts (``python benchmarks/NAME.py``); this module sits next to them
and is imported as ``_common``. Nothing here is timed itself.

CPU time is read from ``/proc/<pid>/task/*/schedstat`` (nanoseconds of on-CPU time, every
thread of the process) rather than ``/proc/<pid>/stat``, whose 10 ms clock ticks are too
coarse for a per-turn figure of about a millisecond.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TITO_SHARED_DIR", REPO.parent / "shared"))
QWEN3_DIR = SHARED / "fixtures" / "tokenizers" / "qwen3"
if str(REPO) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

from tito import launch  # noqa: E402
from tito.launch import ServerProcess  # noqa: E402

# One-token words (with their leading space) of the Qwen3 vocabulary.
WORDS = ("the quick brown fox jumps over the lazy dog and keeps running through the long "
         "green field while the sun goes down over the quiet hills").split()


# -- processes ---------------------------------------------------------------------------
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


# -- statistics ----------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]) of ``values``."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- workload --------------------------------------------------------------------------------
@dataclass
class Workload:
    """The conversation every benchmark session plays, precomputed once.

    Every turn appends the same ``appended`` message (``input_tokens`` tokens of content:
    a ``SAY`` directive that makes the mock answer with exactly ``output_tokens`` ids,
    stop id included, padded with filler words) to the history and the assistant reply.
    ``bridge_ids`` are the ids the gateway appends per turn for it (used by the token-level
    baselines, which replay the same prompts without any tokenization).
    """

    sessions: int
    turns: int
    input_tokens: int
    output_tokens: int
    append_role: str
    content: str
    content_tokens: int
    first_prompt_ids: list[list[int]]
    bridge_ids: list[int]
    first_messages: list[list[dict[str, Any]]]
    appended: dict[str, Any]
    max_tokens: int
    notes: list[str] = field(default_factory=list)
    concurrency: int = 0
    """Sessions running at once (0: all of them)."""
    keep_sessions: bool = False
    """Leave the gateway sessions alive after the run (the memory benchmark reads them)."""
    stagger_s: float = 0.0
    """Session i starts i/S of this after the first, so requests do not arrive in bursts."""
    routing: str | None = None
    """Routing replay: ``incremental`` (rows after the stored prefix) or ``full`` (every
    row, every turn); the token baselines ask the engine for the same rows."""


def add_workload_args(p: Any) -> None:
    """The plain workload's flags (an ``argparse`` parser): S sessions at once, T turns each,
    I content tokens appended and O tokens generated per turn."""
    p.add_argument("--sessions", "-S", type=int, default=32, help="concurrent sessions")
    p.add_argument("--turns", "-T", type=int, default=20, help="turns per session")
    p.add_argument("--input-tokens", "-I", type=int, default=64,
                   help="content tokens of the message appended every turn")
    p.add_argument("--output-tokens", "-O", type=int, default=64,
                   help="tokens generated per turn (stop id included; >= 7)")


def say_text(renderer: Any, output_tokens: int) -> str:
    """A SAY text whose reply renders to exactly ``output_tokens`` ids (stop id included)."""
    n = max(1, output_tokens - 6)
    for _ in range(64):
        text = " ".join(WORDS[k % len(WORDS)] for k in range(n))
        got = len(renderer.render_completion({"role": "assistant", "content": text}))
        if got == output_tokens:
            return text
        n += output_tokens - got
        if n < 1:
            break
    raise ValueError(f"cannot script a reply of exactly {output_tokens} tokens "
                     "(the Qwen3 reply overhead is 6 tokens: use --output-tokens >= 7)")


def build_content(tokenizer: Any, say: str, input_tokens: int) -> tuple[str, int]:
    """The appended message text: the SAY line, padded to ``input_tokens`` tokens if room."""
    content = "SAY " + say
    n = len(tokenizer.encode(content))
    if n + 2 > input_tokens:
        return content, n
    pad = input_tokens - n - 1  # "\n" + words
    for _ in range(16):
        line = " ".join(WORDS[k % len(WORDS)] for k in range(max(1, pad)))
        text = content + "\n" + line
        got = len(tokenizer.encode(text))
        if got == input_tokens:
            return text, got
        pad += input_tokens - got
    return text, got


def build_workload(tokenizer_dir: Path, *, sessions: int, turns: int, input_tokens: int,
                   output_tokens: int, append_role: str = "tool") -> Workload:
    from tito.render import build_renderer

    renderer = build_renderer("qwen3", tokenizer_dir)
    say = say_text(renderer, output_tokens)
    content, content_tokens = build_content(renderer.tokenizer, say, input_tokens)
    notes = []
    if content_tokens != input_tokens:
        notes.append(f"the SAY directive for {output_tokens} output tokens needs "
                     f"{content_tokens} content tokens: input per turn is {content_tokens}, "
                     f"not {input_tokens}")
    first: list[list[dict[str, Any]]] = []
    first_ids: list[list[int]] = []
    for i in range(sessions):
        msgs = [{"role": "system", "content": f"You are benchmark agent {i}."},
                {"role": "user", "content": content}]
        first.append(msgs)
        first_ids.append(list(renderer.render_prompt(msgs)))
    appended: dict[str, Any] = {"role": append_role, "content": content}
    if append_role == "tool":
        appended["tool_call_id"] = "call_0"
    reply = {"role": "assistant", "content": say, "reasoning_content": ""}
    bridge = renderer.bridge(reply, renderer.primary_stop_id, [appended])
    assert bridge.drop == 0
    return Workload(sessions, turns, input_tokens, output_tokens, append_role, content,
                    content_tokens, first_ids, list(bridge.ids), first, appended,
                    max_tokens=output_tokens + 16, notes=notes)


# -- load generator (runs in its own process, own event loop) ------------------------------
SAMPLING = {
    "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
    "presence_penalty": 0.0, "repetition_penalty": 1.0, "no_stop_trim": True,
    "skip_special_tokens": False,
}


@dataclass
class LoadResult:
    mode: str
    wall_s: float
    latencies_ms: list[float]
    errors: list[str]
    loadgen_cpu_s: float
    output_tokens: int
    prompt_tokens_last: int
    prompt_growth: float
    session_ids: list[str] = field(default_factory=list)


_JSON_HEADERS = {"content-type": "application/json"}


@dataclass
class _Tally:
    """What the sessions of one load run measured (one event loop: no locking needed)."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    out_tokens: int = 0
    last_prompt: int = 0
    growth: list[int] = field(default_factory=list)

    def record_turn(self, prompt_tokens: int, prev: int, output_tokens: int) -> int:
        """Count one answered turn; returns its prompt length (the next turn's ``prev``)."""
        self.out_tokens += output_tokens
        if prev:
            self.growth.append(prompt_tokens - prev)
        self.last_prompt = max(self.last_prompt, prompt_tokens)
        return prompt_tokens


@dataclass
class _Payloads:
    """The request pieces every turn reuses, serialized once."""

    appended_json: bytes
    tail: bytes
    sampling: dict[str, Any]
    bridge_json: bytes

    @classmethod
    def of(cls, wl: Workload) -> _Payloads:
        import orjson

        return cls(appended_json=orjson.dumps(wl.appended),
                   tail=orjson.dumps({"max_tokens": wl.max_tokens, "temperature": 1.0})[1:],
                   sampling={**SAMPLING, "max_new_tokens": wl.max_tokens},
                   bridge_json=orjson.dumps(wl.bridge_ids)[1:-1])


class _LoadRun:
    """One load generator run: the sessions of ``wl`` against ``url`` over ``http``."""

    def __init__(self, mode: str, url: str, wl: Workload, http: Any) -> None:
        self.mode = mode
        self.url = url
        self.wl = wl
        self.http = http
        self.sids: list[str] = []
        self.tally = _Tally()

    async def open_sessions(self) -> None:
        """Create the gateway sessions (the token baselines have none)."""
        if self.mode != "gateway":
            return
        for _ in range(self.wl.sessions):
            async with self.http.post(self.url + "/sessions") as resp:
                self.sids.append((await resp.json())["session_id"])

    async def warm_pool(self) -> None:
        """Warm the connection pool so the timed run does not pay for TCP handshakes."""
        async def ping() -> None:
            async with self.http.get(self.url + "/health") as resp:
                await resp.read()
        await asyncio.gather(*(ping() for _ in range(min(self.wl.sessions, 256))))

    async def timed_post(self, endpoint: str, body: bytes) -> bytes | None:
        """POST ``body``, record its latency; the response body, or None (error recorded)."""
        t0 = time.perf_counter()
        async with self.http.post(endpoint, data=body, headers=_JSON_HEADERS) as resp:
            raw = await resp.read()
            status = resp.status
        self.tally.latencies.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            self.tally.errors.append(f"{status}: {raw[:300]!r}")
            return None
        return raw

    async def chat_session(self, i: int, pay: _Payloads) -> None:
        """Session ``i`` through the gateway: the full chat history every turn."""
        import orjson

        wl, tally = self.wl, self.tally
        endpoint = f"{self.url}/sessions/{self.sids[i]}/v1/chat/completions"
        history = bytearray(b",".join(orjson.dumps(m) for m in wl.first_messages[i]))
        prev = 0
        for t in range(wl.turns):
            raw = await self.timed_post(endpoint, b'{"messages":[' + history + b"]," + pay.tail)
            if raw is None:
                return
            data = orjson.loads(raw)
            choice = data["choices"][0]
            usage = data["usage"]
            prev = tally.record_turn(usage["prompt_tokens"], prev, usage["completion_tokens"])
            if choice["finish_reason"] != "stop":
                tally.errors.append(f"turn {t}: finish_reason {choice['finish_reason']}")
            history += b"," + orjson.dumps(choice["message"]) + b"," + pay.appended_json

    async def token_session(self, i: int, pay: _Payloads) -> None:
        """Session ``i`` as token requests to ``/generate`` (the gateway's ids, precomputed)."""
        import orjson

        wl, tally = self.wl, self.tally
        endpoint = f"{self.url}/generate"
        ids = bytearray(orjson.dumps(wl.first_prompt_ids[i])[1:-1])
        n_ids = len(wl.first_prompt_ids[i])
        prev = 0
        for t in range(wl.turns):
            request: dict[str, Any] = {"rid": f"bench-{self.mode}-{i}-{t}",
                                       "sampling_params": pay.sampling, "return_logprob": True,
                                       "logprob_start_len": -1, "stream": False}
            if wl.routing is not None:  # the rows the gateway would ask for
                start = n_ids - len(wl.bridge_ids) - 1 if t and wl.routing == "incremental" \
                    else 0
                request.update(return_routed_experts=True, routed_experts_start_len=start)
            head = orjson.dumps(request)
            raw = await self.timed_post(endpoint, b'{"input_ids":[' + ids + b"]," + head[1:])
            if raw is None:
                return
            data = orjson.loads(raw)
            output = data["output_ids"]
            prev = tally.record_turn(n_ids, prev, len(output))
            if data["meta_info"]["finish_reason"]["type"] != "stop":
                tally.errors.append(f"turn {t}: finish {data['meta_info']['finish_reason']}")
            ids += b"," + orjson.dumps(output)[1:-1] + b"," + pay.bridge_json
            n_ids += len(output) + len(wl.bridge_ids)

    async def run_sessions(self) -> tuple[float, float]:
        """Play every session (bounded, staggered); the wall and own CPU seconds it took."""
        wl = self.wl
        pay = _Payloads.of(wl)
        run = self.chat_session if self.mode == "gateway" else self.token_session
        limit = asyncio.Semaphore(wl.concurrency or wl.sessions)

        async def bounded(i: int) -> None:
            if wl.stagger_s > 0:
                await asyncio.sleep(wl.stagger_s * i / wl.sessions)
            async with limit:
                await run(i, pay)

        cpu0 = time.process_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(bounded(i) for i in range(wl.sessions)))
        wall = time.perf_counter() - t0
        return wall, time.process_time() - cpu0

    async def close_sessions(self) -> None:
        """Delete the gateway sessions unless the workload keeps them."""
        if self.mode != "gateway" or self.wl.keep_sessions:
            return

        async def delete(sid: str) -> None:
            async with self.http.delete(f"{self.url}/sessions/{sid}") as resp:
                await resp.read()
        await asyncio.gather(*(delete(s) for s in self.sids))

    def result(self, wall: float, cpu: float) -> LoadResult:
        t = self.tally
        return LoadResult(self.mode, wall, t.latencies, t.errors, cpu, t.out_tokens,
                          t.last_prompt, statistics.fmean(t.growth) if t.growth else float("nan"),
                          self.sids)


async def _run_load(mode: str, url: str, wl: Workload, conn: Any) -> LoadResult:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=600)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        load = _LoadRun(mode, url, wl, http)
        await load.open_sessions()
        await load.warm_pool()
        conn.send("ready")
        conn.recv()  # "go"
        wall, cpu = await load.run_sessions()
        await load.close_sessions()
    return load.result(wall, cpu)


def _loadgen_main(mode: str, url: str, wl: Workload, conn: Any) -> None:
    result = asyncio.run(_run_load(mode, url, wl, conn))
    conn.send(result)
    conn.close()


@dataclass
class PhaseResult:
    load: LoadResult
    server_cpu_s: dict[str, float]
    peak_rss: dict[str, int]
    other_cores: float
    """Average cores used by processes outside the benchmark during the timed run."""


def run_phase(mode: str, url: str, wl: Workload, watch: dict[str, int]) -> PhaseResult:
    """Run the load generator in a child process against ``url``.

    ``watch`` maps a name to a pid whose CPU time is measured over exactly the timed part
    (the child says ``ready`` after its setup and waits for ``go``).
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_loadgen_main, args=(mode, url, wl, child), daemon=True)
    proc.start()
    deadline = time.monotonic() + 300
    while not parent.poll(0.2):
        if not proc.is_alive() or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"load generator ({mode}) did not get ready")
    assert parent.recv() == "ready"
    before = {name: cpu_ns(pid) for name, pid in watch.items()}
    busy0 = busy_cpu_s()
    parent.send("go")
    load: LoadResult = parent.recv()
    busy = busy_cpu_s() - busy0
    after = {name: cpu_ns(pid) for name, pid in watch.items()}
    proc.join(30)
    cpu = {name: (after[name] - before[name]) / 1e9 for name in watch}
    other = max(0.0, busy - sum(cpu.values()) - load.loadgen_cpu_s) / max(load.wall_s, 1e-9)
    return PhaseResult(load, cpu, {name: peak_rss_bytes(pid) for name, pid in watch.items()},
                       other)


# -- profiling -----------------------------------------------------------------------------------
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


# -- output ------------------------------------------------------------------------------------
def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                caption: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption=caption, caption_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(str(c) for c in row))
    Console(width=max(100, sum(len(c) + 6 for c in columns) + 30)).print(table)


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return f"{value:,.{digits}f}"
