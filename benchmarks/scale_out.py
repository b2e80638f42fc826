"""Scale-out: sessions spread over several engines (``--engine-url`` repeated) and over
several gateway processes (``--workers N``).

Each row starts fresh processes: K ``tito mock-engine`` s and one ``tito serve`` (with
``--workers N``), then runs S sessions of T turns, ``--concurrency`` at a time, from an
asyncio load generator in this process (every turn sends the whole history plus a user
message with a ``SAY`` directive, as an agent does). The engines table shows the
placement: requests and sessions per engine (from the gateway's ``/metrics``), the
max/min balance, sessions moved, and turns/s. The workers table shows turns/s and the
gateways' CPU per turn. On this 2-core VM the engines, the gateways and the load
generator share the cores, so the figures show the spread and the overhead, not a
many-core speed-up.

    python benchmarks/scale_out.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from _paths import QWEN3_DIR
from _processes import cpu_ns, start_mock, start_server
from _tables import fmt, print_table

from tito.launch import tito_command
from tito.net import free_port_block

SAY = "SAY " + " ".join(["one two three four"] * 4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sessions", "-S", type=int, default=64)
    p.add_argument("--turns", "-T", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--engines", default="1,2,4", help="engine counts of the first table")
    p.add_argument("--workers", default="1,2", help="worker counts of the second table")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)




async def load(urls: list[str], sessions: int, turns: int, concurrency: int) -> float:
    """Run the sessions (placed over ``urls`` in turn); return the seconds it took."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(
            max_connections=concurrency * 2)) as http:

        async def one(i: int) -> None:
            async with gate:
                url = urls[i % len(urls)]
                sid = (await http.post(url + "/sessions")).json()["session_id"]
                messages: list[dict[str, Any]] = []
                for t in range(turns):
                    messages.append({"role": "user", "content": f"Turn {t} of {i}.\n{SAY}"})
                    reply = await http.post(f"{url}/sessions/{sid}/v1/chat/completions",
                                            json={"messages": messages, "max_tokens": 32})
                    reply.raise_for_status()
                    messages.append(reply.json()["choices"][0]["message"])
                await http.delete(f"{url}/sessions/{sid}")

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(sessions)))
        return time.perf_counter() - start


def engine_figures(metrics: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for m in re.finditer(r'^tito_engine_(\w+)\{engine="([^"]+)"\} (\S+)$', metrics, re.M):
        out.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
    return out


def gateway(flags: list[str], name: str) -> Any:
    return start_server(name, tito_command("serve", *flags))


def engines_row(args: argparse.Namespace, k: int) -> dict[str, Any]:
    mocks = [start_mock(args.tokenizer) for _ in range(k)]
    flags = ["--tokenizer", str(args.tokenizer), "--family", "qwen3", "--port", "0",
             "--log-level", "warning"]
    for mock in mocks:
        flags += ["--engine-url", mock.url]
    gw = gateway(flags, "tito serve")
    try:
        seconds = asyncio.run(load([gw.url], args.sessions, args.turns, args.concurrency))
        figures = engine_figures(httpx.get(gw.url + "/metrics").text)
    finally:
        gw.stop()
        for mock in mocks:
            mock.stop()
    requests = [f.get("requests_total", 0.0) for f in figures.values()] or \
        [float(args.sessions * args.turns)]
    return {"engines": k, "turns_per_s": args.sessions * args.turns / seconds,
            "requests_per_engine": requests,
            "balance": max(requests) / max(min(requests), 1.0),
            "failed": sum(f.get("failures_total", 0.0) for f in figures.values())}


def workers_row(args: argparse.Namespace, n: int) -> dict[str, Any]:
    mock = start_mock(args.tokenizer)
    base = free_port_block(n)
    flags = ["--engine-url", mock.url, "--tokenizer", str(args.tokenizer), "--family",
             "qwen3", "--port", str(base), "--workers", str(n), "--log-level", "warning"]
    gw = gateway(flags, "tito serve --workers")
    urls = [f"http://127.0.0.1:{base + i}" for i in range(n)]
    try:
        pids = [gw.pid, *_children(gw.pid)]
        before = sum(cpu_ns(p) for p in pids)
        seconds = asyncio.run(load(urls, args.sessions, args.turns, args.concurrency))
        cpu = (sum(cpu_ns(p) for p in pids) - before) / 1e9
    finally:
        gw.stop()
        mock.stop()
    turns = args.sessions * args.turns
    return {"workers": n, "turns_per_s": turns / seconds, "cpu_ms_per_turn": cpu * 1e3 / turns}


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (the workers the supervisor started)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(p) for p in text]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.tokenizer.is_dir():
        print(f"no tokenizer folder {args.tokenizer}", file=sys.stderr)
        return 2
    engines = [engines_row(args, int(k)) for k in args.engines.split(",")]
    print_table(f"several engines: S={args.sessions} sessions x T={args.turns} turns, "
                f"{args.concurrency} at a time",
                ["engines", "turns/s", "requests per engine", "max/min", "failed requests"],
                [[r["engines"], fmt(r["turns_per_s"], 0),
                  ", ".join(str(int(x)) for x in r["requests_per_engine"]),
                  fmt(r["balance"]), int(r["failed"])] for r in engines])
    workers = [workers_row(args, int(n)) for n in args.workers.split(",")]
    print_table(f"several gateway workers: one mock engine, S={args.sessions} x "
                f"T={args.turns}",
                ["workers", "turns/s", "gateway CPU per turn (ms)"],
                [[r["workers"], fmt(r["turns_per_s"], 0), fmt(r["cpu_ms_per_turn"], 3)]
                 for r in workers],
                caption="engines, gateways and the load generator share this machine's "
                        "cores")
    if args.json is not None:
        args.json.write_text(json.dumps({"engines": engines, "workers": workers}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
