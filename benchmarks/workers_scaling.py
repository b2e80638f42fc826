"""Gateway workers: ``tito serve --workers 2`` against one worker, turns/s and CPU per turn.

Each round starts fresh processes for each worker count (interleaved: 1, 2, 1, 2, ...):
one ``tito mock-engine`` and ``tito serve --workers N`` (a supervisor and N workers on
consecutive ports), then plays S sessions of T turns (I content tokens appended, O
generated per turn; ``--concurrency`` at a time) from the aiohttp load generator in its
own process, session i placed on worker ``i % N`` (as a client's ``SessionTracer([url0,
url1, ...])`` places them). Over exactly the timed part it reads the on-CPU time of every
party: the gateway (supervisor + workers), the engine, the load generator, and the rest
of the machine (other processes).

On a machine where the engine and the load generator share the gateway's cores, turns/s
is bounded by ``cores / (gateway + engine + load generator CPU per turn)`` whatever the
worker count, so the measured turns/s ratio understates what a second worker gives. The
figure that carries to N cores is the gateway's own CPU per turn with N workers: with the
engine and the clients elsewhere, N workers on N cores serve about ``N / (CPU per turn)``
turns/s, so the capacity ratio of 2 workers to 1 is ``2 x cpu(1) / cpu(2)``.

    python benchmarks/workers_scaling.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from _load import run_phase
from _paths import QWEN3_DIR
from _processes import start_mock, start_server
from _tables import fmt, print_table
from _workload import add_workload_args, build_workload

from tito.launch import tito_command
from tito.net import free_port_block


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_workload_args(p)
    p.set_defaults(sessions=64, turns=8)
    p.add_argument("--concurrency", type=int, default=32, help="sessions running at once")
    p.add_argument("--workers", default="1,2", help="worker counts compared")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    p.add_argument("--same-total-load", dest="per_worker", action="store_false",
                   help="the same S sessions and concurrency whatever the worker count "
                        "(default: S and --concurrency per worker, so every worker sees the "
                        "load one worker sees alone)")
    p.add_argument("--gateway-cpus", default=None, metavar="LIST",
                   help="pin the gateway (supervisor and workers) to these CPUs (taskset "
                        "list, e.g. 0,1) and the engine and the load generator to the "
                        "others: on a machine with spare cores, the gateway alone on N cores")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def cpu_list(text: str) -> set[int]:
    """A taskset CPU list (``0,1`` or ``0-3,6``)."""
    out: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (the workers the supervisor started)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(p) for p in (task / "children").read_text().split()]
    return out


def wait_encoders(urls: list[str]) -> None:
    """Every worker's fast encoder built (its build would count as gateway CPU)."""
    deadline = time.monotonic() + 120
    for url in urls:
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url + "/health", timeout=5) as reply:
                caps = json.loads(reply.read()).get("capabilities", {})
            if caps.get("fast_encoder_state") != "building":
                break
            time.sleep(0.05)


def one_run(args: argparse.Namespace, n: int) -> dict[str, float]:
    pin = ["taskset", "-c", args.gateway_cpus] if args.gateway_cpus else []
    scale = n if args.per_worker else 1
    wl = build_workload(args.tokenizer, sessions=args.sessions * scale, turns=args.turns,
                        input_tokens=args.input_tokens, output_tokens=args.output_tokens)
    wl.concurrency = args.concurrency * scale
    warm = build_workload(args.tokenizer, sessions=4 * n, turns=2,
                          input_tokens=args.input_tokens, output_tokens=args.output_tokens)
    mock = start_mock(args.tokenizer)
    base = free_port_block(n)
    cmd = [*pin, *tito_command("serve", "--engine-url", mock.url, "--tokenizer",
                               str(args.tokenizer), "--family", "qwen3", "--port", str(base),
                               "--workers", str(n), "--log-level", "warning")]
    gw = start_server("tito serve --workers", cmd)
    urls = ",".join(f"http://127.0.0.1:{base + i}" for i in range(n))
    try:
        wait_encoders(urls.split(","))
        # --workers 1 serves in the process itself; N > 1: a supervisor and N children
        workers = children(gw.pid) or [gw.pid]
        watch = {"engine": mock.pid, **{f"worker{i}": pid for i, pid in enumerate(workers)}}
        if workers != [gw.pid]:
            watch["supervisor"] = gw.pid
        run_phase("gateway", urls, warm, watch)
        phase = run_phase("gateway", urls, wl, watch)
    finally:
        gw.stop()
        mock.stop()
    load = phase.load
    if load.errors:
        raise SystemExit(f"load errors: {load.errors[:3]}")
    turns = wl.sessions * wl.turns
    cpu = phase.server_cpu_s
    gateway = sum(v for k, v in cpu.items() if k != "engine")
    busiest = max(v for k, v in cpu.items() if k.startswith("worker"))
    return {"workers": n, "turns_per_s": turns / load.wall_s,
            "gateway_ms": gateway * 1e3 / turns, "engine_ms": cpu["engine"] * 1e3 / turns,
            "loadgen_ms": load.loadgen_cpu_s * 1e3 / turns,
            "supervisor_ms": cpu.get("supervisor", 0.0) * 1e3 / turns,
            "busiest_worker_cores": busiest / load.wall_s,
            "gateway_cores": gateway / load.wall_s, "other_cores": phase.other_cores}


def median_rows(runs: list[dict[str, float]]) -> list[dict[str, float]]:
    out = []
    for n in sorted({int(r["workers"]) for r in runs}):
        mine = [r for r in runs if r["workers"] == n]
        out.append({k: statistics.median(r[k] for r in mine) for k in mine[0]})
    return out


def report(rows: list[dict[str, float]], args: argparse.Namespace) -> dict[str, float]:
    print_table(
        f"gateway workers: one mock engine, S={args.sessions} x T={args.turns} "
        f"(I={args.input_tokens} O={args.output_tokens}), {args.concurrency} at a time"
        f"{' per worker' if args.per_worker else ''}, median of {args.rounds} interleaved "
        "rounds",
        ["workers", "turns/s", "gateway CPU/turn (ms)", "of which supervisor",
         "engine CPU/turn (ms)",
         "load gen CPU/turn (ms)", "gateway cores", "busiest worker cores",
         "other processes (cores)"],
        [[int(r["workers"]), fmt(r["turns_per_s"], 0), fmt(r["gateway_ms"], 3),
          fmt(r["supervisor_ms"], 3),
          fmt(r["engine_ms"], 3), fmt(r["loadgen_ms"], 3), fmt(r["gateway_cores"], 2),
          fmt(r["busiest_worker_cores"], 2), fmt(r["other_cores"], 2)] for r in rows],
        caption="CPU per turn over the timed part; the engine, the load generator and "
                "other processes share the machine's cores with the gateway")
    one, two = rows[0], rows[-1]
    k = two["workers"] / one["workers"]
    ratios = {"measured_turns_ratio": two["turns_per_s"] / one["turns_per_s"],
              "gateway_capacity_ratio": k * one["gateway_ms"] / two["gateway_ms"],
              "machine_bound_turns_per_s": 2e3 / (two["gateway_ms"] + two["engine_ms"]
                                                  + two["loadgen_ms"])}
    print_table(f"{int(two['workers'])} workers vs {int(one['workers'])}",
                ["figure", "value"],
                [["measured turns/s ratio (this machine, everything sharing its cores)",
                  f"{ratios['measured_turns_ratio']:.2f}x"],
                 ["gateway capacity ratio: N x cpu(1 worker) / cpu(N workers)",
                  f"{ratios['gateway_capacity_ratio']:.2f}x"],
                 ["2 cores / (gateway + engine + load gen CPU per turn): the ceiling here",
                  f"{ratios['machine_bound_turns_per_s']:.0f} turns/s"]],
                caption="target: >= 1.7x one worker's turns/s on 2 cores")
    return ratios


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.tokenizer.is_dir():
        print(f"no tokenizer folder {args.tokenizer}", file=sys.stderr)
        return 2
    if args.gateway_cpus:  # this process, the engine and the load generator: the rest
        gateway = cpu_list(args.gateway_cpus)
        rest = os.sched_getaffinity(0) - gateway
        if not rest:
            raise SystemExit("--gateway-cpus leaves no CPU for the engine and load generator")
        os.sched_setaffinity(0, rest)
    counts = [int(n) for n in args.workers.split(",")]
    runs = [one_run(args, n) for _ in range(args.rounds) for n in counts]
    rows = median_rows(runs)
    ratios = report(rows, args)
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": runs, "rows": rows, **ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
