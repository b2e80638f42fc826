"""Load test: many agent sessions through the openai SDK, every sample checked.

Starts ``tito mock-engine`` (its default keep-alive: uvicorn's 5 s) and ``tito serve``
(Qwen3 tokenizer, family qwen3), then runs S sessions of T turns each, C sessions at a
time, in this process. Each session is an agent loop on the real ``openai.AsyncOpenAI``
SDK (``max_retries=0``): the last user or tool message scripts the mock's reply
(``CALL`` one or two parallel tool calls, ``THINK`` on some turns, ``SAY`` on the last
turn), the agent checks the reply against its script, appends it and one tool result per
call, optionally idles ``--idle-ms`` (past the engine's 5 s keep-alive, pooled
connections go stale) and sends the next turn. After its last turn a session collects
its samples (``POST /sessions/<id>/samples``), decodes them and deletes itself.

Every sample is checked without the mock's request log: ``tito.client.checks.
sample_violations`` (structure, lengths of tokens / loss_mask / logprobs, mask values,
logprobs, strict ``tito_session_mismatch`` classes), status ``completed``, and the loss
mask exactly 1 on the generated spans and 0 on the bridges, rebuilt from each turn's
``usage`` (``response_length`` = generated + bridge tokens after the first prompt).

Printed: sessions, turns, errors by status and code, TITO violations, turns/s, latency
p50/p99, gateway CPU per turn (turns and collects, schedstat), gateway and mock peak RSS
(VmHWM), and the gateway's ``/metrics`` error and disconnect counters. Exit status 1 on
any error or violation.

    python benchmarks/load_test.py                              # 1000 sessions x 20 turns, C=64
    python benchmarks/load_test.py --sessions 50 --turns 5      # a quick check
    python benchmarks/load_test.py --idle-ms 6000 --sessions 64 --turns 3  # stale connections
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import ssl
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
from _paths import QWEN3_DIR
from _processes import Proc, busy_cpu_s, cpu_ns, peak_rss_bytes, start_gateway, start_mock
from _tables import fmt, percentile, print_table

from tito import decode_samples
from tito.client.checks import sample_violations

METRICS_OF_INTEREST = ("tito_errors_total", "tito_client_disconnects_total",
                       "tito_engine_aborts_total", "tito_turns_total", "tito_samples_total",
                       "tito_sessions_created_total")
EXAMPLES_KEPT = 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sessions", "-S", type=int, default=1000, help="sessions in all")
    p.add_argument("--turns", "-T", type=int, default=20, help="turns per session")
    p.add_argument("--concurrency", "-C", type=int, default=64, help="sessions at a time")
    p.add_argument("--idle-ms", type=float, default=0.0,
                   help="pause between two turns of a session (6000 exceeds the mock "
                        "engine's 5 s keep-alive, so pooled connections go stale)")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--timeout", type=float, default=600.0, help="SDK timeout per request (s)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


# -- the script ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """What the mock is told to answer on one turn (the directive lines of the message)."""

    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    say: str | None = None
    think: str | None = None

    def text(self) -> str:
        lines = [f"THINK {self.think}"] if self.think else []
        lines += [f"CALL {name} {json.dumps(args)}" for name, args in self.calls]
        if self.say is not None:
            lines.append(f"SAY {self.say}")
        return "\n".join(lines)


def step(session: int, turn: int, turns: int) -> Step:
    """Turn ``turn`` of ``session``: tool calls (two in parallel every fourth turn), a final
    answer on the last turn, reasoning every third turn."""
    think = f"turn {turn}: what does agent {session} need next?" if turn % 3 == 1 else None
    if turn == turns - 1:
        return Step(say=f"Agent {session} is done after {turns} turns.", think=think)
    calls: tuple[tuple[str, dict[str, Any]], ...] = (
        ("search", {"query": f"item {session}-{turn}", "limit": turn % 5 + 1}),)
    if turn % 4 == 2:
        calls += (("fetch", {"url": f"https://example.org/{session}/{turn}"}),)
    return Step(calls=calls, think=think)


def reply_problem(message: Any, finish: str | None, expected: Step) -> str | None:
    """Why the SDK's reply is not what the script asked for (None: it is)."""
    want_finish = "tool_calls" if expected.calls else "stop"
    if finish != want_finish:
        return f"finish_reason {finish!r}, expected {want_finish!r}"
    got = [(c.function.name, json.loads(c.function.arguments))
           for c in (message.tool_calls or [])]
    if got != [(name, args) for name, args in expected.calls]:
        return f"tool calls {got!r}, expected {list(expected.calls)!r}"
    if expected.say is not None and (message.content or "").strip() != expected.say:
        return f"content {message.content!r}, expected {expected.say!r}"
    reasoning = (getattr(message, "reasoning_content", None) or "").strip()
    if reasoning != (expected.think or ""):
        return f"reasoning {reasoning!r}, expected {expected.think!r}"
    return None


# -- results -------------------------------------------------------------------------------
@dataclass
class Tally:
    """What every session measured (one event loop: no locking)."""

    latencies_ms: list[float] = field(default_factory=list)
    turns: int = 0
    sessions_done: int = 0
    samples: int = 0
    sample_tokens: list[int] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    error_examples: list[str] = field(default_factory=list)
    violations: Counter[str] = field(default_factory=Counter)
    violation_examples: list[str] = field(default_factory=list)

    def error(self, key: str, detail: str) -> None:
        self.errors[key] += 1
        if len(self.error_examples) < EXAMPLES_KEPT:
            self.error_examples.append(f"{key}: {detail[:400]}")

    def violation(self, key: str, detail: str) -> None:
        self.violations[key] += 1
        if len(self.violation_examples) < EXAMPLES_KEPT:
            self.violation_examples.append(f"{key}: {detail[:400]}")


def error_key(exc: Exception) -> str:
    """``status code`` of an SDK or HTTP failure; the exception type otherwise."""
    if isinstance(exc, openai.APIStatusError):
        return f"{exc.status_code} {exc.code or '-'}"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return f"connection ({type(exc.__cause__).__name__})"
    return type(exc).__name__


def expected_mask(usage: list[tuple[int, int]]) -> np.ndarray | None:
    """The loss mask of the turns' (prompt, completion) token counts: each turn's bridge
    (its prompt past the previous turn's end) 0, its completion 1; None if a prompt does
    not extend the previous turn (qwen3 trims nothing)."""
    parts: list[np.ndarray] = []
    end: int | None = None
    for prompt, completion in usage:
        if end is not None:
            if prompt < end:
                return None
            parts.append(np.zeros(prompt - end, dtype=np.int64))
        parts.append(np.ones(completion, dtype=np.int64))
        end = prompt + completion
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def sample_problems(sample: Any, usage: list[tuple[int, int]]) -> list[str]:
    """The TITO checks of one sample (see the module docstring)."""
    out = [f"violation: {v}" for v in sample_violations(sample)]
    if sample.status != "completed":
        out.append(f"status {sample.status}")
    if not usage:
        return out
    first_prompt, (last_prompt, last_completion) = usage[0][0], usage[-1]
    if len(sample.tokens) != last_prompt + last_completion:
        out.append(f"{len(sample.tokens)} tokens, the last turn ended at "
                   f"{last_prompt + last_completion}")
    if sample.response_length != last_prompt + last_completion - first_prompt:
        out.append(f"response_length {sample.response_length}, generated + bridge "
                   f"{last_prompt + last_completion - first_prompt}")
    mask = expected_mask(usage)
    for name in ("loss_mask", "rollout_log_probs"):
        value = getattr(sample, name)
        if value is None or len(value) != sample.response_length:
            out.append(f"{name} has {None if value is None else len(value)} entries, "
                       f"response_length {sample.response_length}")
    if mask is None or sample.loss_mask is None or \
            not np.array_equal(np.asarray(sample.loss_mask, dtype=np.int64), mask):
        out.append("loss_mask is not 1 exactly on the generated spans")
    return out


# -- one session -----------------------------------------------------------------------------
class Agent:
    """One session: create, T turns through the SDK, collect, check, delete."""

    def __init__(self, index: int, args: argparse.Namespace, http: Any, url: str,
                 tally: Tally) -> None:
        self.index = index
        self.args = args
        self.http = http
        self.url = url
        self.tally = tally
        self.usage: list[tuple[int, int]] = []

    async def run(self) -> None:
        try:
            resp = await self.http.post(f"{self.url}/sessions")
            resp.raise_for_status()
            sid = resp.json()["session_id"]
        except Exception as exc:
            self.tally.error(f"create {error_key(exc)}", repr(exc))
            return
        try:
            await self.turns(sid)
            await self.collect(sid)
        finally:
            await self.http.delete(f"{self.url}/sessions/{sid}")
        self.tally.sessions_done += 1

    async def turns(self, sid: str) -> None:
        sdk = openai.AsyncOpenAI(base_url=f"{self.url}/sessions/{sid}/v1", api_key="unused",
                                 max_retries=0, timeout=self.args.timeout, http_client=self.http)
        first = step(self.index, 0, self.args.turns)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": f"You are load-test agent {self.index}."},
            {"role": "user", "content": f"Task {self.index}: look things up.\n{first.text()}"}]
        for turn in range(self.args.turns):
            if turn and self.args.idle_ms > 0:
                await asyncio.sleep(self.args.idle_ms / 1000)
            expected = step(self.index, turn, self.args.turns)
            t0 = time.perf_counter()
            try:
                reply = await sdk.chat.completions.create(
                    model="tito", messages=messages, max_tokens=256)  # type: ignore[arg-type]
            except Exception as exc:
                self.tally.error(error_key(exc), f"session {self.index} turn {turn}: {exc!r}")
                return
            self.tally.latencies_ms.append((time.perf_counter() - t0) * 1000)
            self.tally.turns += 1
            assert reply.usage is not None
            self.usage.append((reply.usage.prompt_tokens, reply.usage.completion_tokens))
            choice = reply.choices[0]
            if (problem := reply_problem(choice.message, choice.finish_reason, expected)):
                self.tally.error("unexpected reply", f"session {self.index} turn {turn}: "
                                 f"{problem}")
                return
            messages.append(choice.message.model_dump(exclude_none=True))
            messages += self.answers(choice.message, step(self.index, turn + 1, self.args.turns))

    @staticmethod
    def answers(message: Any, following: Step) -> list[dict[str, Any]]:
        """One tool result per call; the last one carries the next turn's directives."""
        out: list[dict[str, Any]] = [
            {"role": "tool", "tool_call_id": call.id,
             "content": f"{call.function.name} found 3 results for {call.function.arguments}"}
            for call in message.tool_calls or []]
        if out:
            out[-1]["content"] += "\n" + following.text()
        return out

    async def collect(self, sid: str) -> None:
        try:
            resp = await self.http.post(f"{self.url}/sessions/{sid}/samples",
                                        json={"include_response": False})
        except Exception as exc:
            self.tally.error(f"samples {error_key(exc)}", repr(exc))
            return
        if resp.status_code != 200:
            code = resp.json().get("error", {}).get("code", "-")
            self.tally.error(f"samples {resp.status_code} {code}", resp.text)
            return
        samples = decode_samples(resp.content).samples
        self.tally.samples += len(samples)
        if len(samples) != (1 if self.usage else 0):  # no turn answered: no sample
            self.tally.violation("sample count", f"session {self.index}: {len(samples)} "
                                 f"samples after {len(self.usage)} turns")
        for sample in samples:
            self.tally.sample_tokens.append(len(sample.tokens))
            for problem in sample_problems(sample, self.usage):
                self.tally.violation(re.sub(r"\d+", "N", problem)[:70],
                                     f"session {self.index}: {problem}")


async def run_load(args: argparse.Namespace, url: str) -> Tally:
    """Every session, ``--concurrency`` at a time. Each session has its own HTTP client (as
    an agent process has; one shared pool of hundreds of connections costs httpcore more
    CPU per request than the gateway spends on the turn); one TLS context serves them all."""
    tally = Tally()
    limit = asyncio.Semaphore(args.concurrency)
    tls = ssl.create_default_context()

    async def bounded(i: int) -> None:
        async with limit, httpx.AsyncClient(timeout=args.timeout, verify=tls) as http:
            await Agent(i, args, http, url, tally).run()

    await asyncio.gather(*(bounded(i) for i in range(args.sessions)))
    return tally


# -- the run ---------------------------------------------------------------------------------
def scrape_metrics(url: str) -> dict[str, float]:
    """The ``/metrics`` samples of :data:`METRICS_OF_INTEREST` (one per label set)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {"tito_errors_total": 0.0, "tito_client_disconnects_total": 0.0}
    for line in text.splitlines():
        if line.startswith(METRICS_OF_INTEREST):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    if any(name.startswith("tito_errors_total{") for name in out):
        del out["tito_errors_total"]  # the labelled series say it
    return out


def peak_rss_mb(pid: int) -> float:
    return peak_rss_bytes(pid) / 2**20


def measure(args: argparse.Namespace, mock: Proc, gateway: Proc) -> dict[str, Any]:
    """Run the load; the figures of the run."""
    cpu0 = {"gateway": cpu_ns(gateway.pid), "mock": cpu_ns(mock.pid)}
    own0 = time.process_time()
    busy0 = busy_cpu_s()
    t0 = time.perf_counter()
    tally = asyncio.run(run_load(args, gateway.url))
    wall = time.perf_counter() - t0
    own = time.process_time() - own0
    cpu = {"gateway": (cpu_ns(gateway.pid) - cpu0["gateway"]) / 1e9,
           "mock": (cpu_ns(mock.pid) - cpu0["mock"]) / 1e9}
    other = max(0.0, busy_cpu_s() - busy0 - own - sum(cpu.values())) / max(wall, 1e-9)
    turns = max(1, tally.turns)
    lat = tally.latencies_ms
    return {
        "sessions": args.sessions, "sessions_done": tally.sessions_done,
        "turns_per_session": args.turns, "concurrency": args.concurrency,
        "idle_ms": args.idle_ms, "turns": tally.turns, "samples": tally.samples,
        "sample_tokens_mean": (sum(tally.sample_tokens) / len(tally.sample_tokens)
                               if tally.sample_tokens else float("nan")),
        "errors": dict(tally.errors), "error_examples": tally.error_examples,
        "violations": dict(tally.violations), "violation_examples": tally.violation_examples,
        "wall_s": wall, "turns_per_s": tally.turns / wall if wall else float("nan"),
        "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
        "max_ms": max(lat) if lat else float("nan"),
        "gateway_cpu_ms_per_turn": cpu["gateway"] * 1000 / turns,
        "mock_cpu_ms_per_turn": cpu["mock"] * 1000 / turns,
        "loadgen_cpu_ms_per_turn": own * 1000 / turns,
        "other_load_cores": other,
        "gateway_peak_rss_mb": peak_rss_mb(gateway.pid),
        "mock_peak_rss_mb": peak_rss_mb(mock.pid),
        "metrics": scrape_metrics(gateway.url),
    }


def report(res: dict[str, Any]) -> None:
    expected_turns = res["sessions"] * res["turns_per_session"]
    rows = [
        ["sessions (done / started)", f"{res['sessions_done']} / {res['sessions']}"],
        ["turns (answered / scripted)", f"{res['turns']} / {expected_turns}"],
        ["samples collected", res["samples"]],
        ["tokens per sample (mean)", fmt(res["sample_tokens_mean"], 0)],
        ["errors", sum(res["errors"].values())],
        ["TITO violations", sum(res["violations"].values())],
        ["wall (s)", fmt(res["wall_s"], 1)],
        ["turns/s", fmt(res["turns_per_s"], 0)],
        ["latency p50 (ms)", fmt(res["p50_ms"])],
        ["latency p99 (ms)", fmt(res["p99_ms"])],
        ["latency max (ms)", fmt(res["max_ms"])],
        ["gateway CPU per turn (ms)", fmt(res["gateway_cpu_ms_per_turn"], 3)],
        ["mock engine CPU per turn (ms)", fmt(res["mock_cpu_ms_per_turn"], 3)],
        ["load generator CPU per turn (ms)", fmt(res["loadgen_cpu_ms_per_turn"], 3)],
        ["other load on the machine (cores)", fmt(res["other_load_cores"])],
        ["gateway peak RSS (MiB)", fmt(res["gateway_peak_rss_mb"], 1)],
        ["mock engine peak RSS (MiB)", fmt(res["mock_peak_rss_mb"], 1)],
    ]
    rows += [[f"error {key}", n] for key, n in sorted(res["errors"].items())]
    rows += [[f"violation {key}", n] for key, n in sorted(res["violations"].items())]
    rows += [[f"/metrics {name}", fmt(value, 0)] for name, value in res["metrics"].items()]
    title = (f"load test: S={res['sessions']} T={res['turns_per_session']} "
             f"C={res['concurrency']} idle={res['idle_ms']:g} ms")
    caption = ("openai SDK agents (max_retries=0) -> tito serve -> tito mock-engine (5 s "
               "keep-alive). CPU per turn from schedstat over the whole run (turns and "
               "collects); RSS peak = VmHWM; other load = busy CPU outside these three "
               "processes.")
    print_table(title, ["", "value"], rows, caption)
    for line in res["error_examples"] + res["violation_examples"]:
        print(f"  e.g. {line}", file=sys.stderr)


def server_errors(gateway: Proc) -> list[str]:
    """The gateway's logged failures (every response >= 500 is logged, with its cause)."""
    return [line for line in gateway.lines if " ERROR " in line]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.tokenizer.is_dir():
        raise SystemExit(f"tokenizer folder not found: {args.tokenizer}")
    procs: list[Proc] = []
    try:
        mock = start_mock(args.tokenizer, log_size=1)
        procs.append(mock)
        gateway = start_gateway(args.tokenizer, mock.url)
        procs.append(gateway)
        res = measure(args, mock, gateway)
        res["gateway_log_errors"] = server_errors(gateway)[-20:]
    finally:
        for proc in reversed(procs):
            proc.stop()
    report(res)
    for line in res["gateway_log_errors"]:
        print(f"  gateway log: {line}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    failed = res["errors"] or res["violations"] or res["turns"] != args.sessions * args.turns
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
