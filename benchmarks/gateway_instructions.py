"""Gateway instructions per turn, counted by valgrind: tito's own work, without the noise.

The CPU-time benchmarks vary run to run on a shared VM by far more than a change of a few
percent (docs/performance.md gives the spread), so such a change cannot be seen in one
invocation. This script runs ``gateway_inprocess.py``'s harness (the real app called as
ASGI, the real SGLang client with a canned reply; or the JSON-only floor app) under
``valgrind --tool=callgrind`` and counts the instructions the timed part executes: the
count is the same from one invocation to the next within about 0.2%, so two trees can be
compared with one run each (run the script from each checkout: it measures the ``tito``
of the tree it is in). Instructions are not time (a cache miss costs hundreds of cycles
and no instruction), so use it next to the timed benchmarks, not instead of them.

Needs valgrind (Debian: ``apt install valgrind``). Each app takes about two minutes,
mostly the gateway's startup under valgrind.

    python benchmarks/gateway_instructions.py                  # S=32 T=20, floor and tito
    (cd /tmp/base && python benchmarks/gateway_instructions.py --apps tito)  # another tree
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _paths import QWEN3_DIR
from _tables import fmt, print_table

APPS = ("floor", "tito")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sessions", "-S", type=int, default=32)
    p.add_argument("--turns", "-T", type=int, default=20)
    p.add_argument("--input-tokens", "-I", type=int, default=64)
    p.add_argument("--output-tokens", "-O", type=int, default=64)
    p.add_argument("--apps", default=",".join(APPS), help="comma-separated subset of "
                   "floor,tito")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--child", choices=APPS, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def child(args: argparse.Namespace) -> None:
    """One warm run, then the timed run inside ``operator.call`` (the C function that
    callgrind's ``--toggle-collect`` switches counting on for)."""
    import gateway_inprocess as harness
    from _workload import build_workload

    from tito.heap import freeze_startup_heap, tune_for_serving
    from tito.render import build_renderer

    wl = build_workload(args.tokenizer, sessions=args.sessions, turns=args.turns,
                        input_tokens=args.input_tokens, output_tokens=args.output_tokens)
    reply = harness.canned_reply(build_renderer("qwen3", args.tokenizer), args.output_tokens)
    app = harness.gateway_app(args.tokenizer, reply) if args.child == "tito" \
        else harness.floor_app(reply, {})
    tune_for_serving()
    freeze_startup_heap()
    loop = asyncio.new_event_loop()
    lifespan = harness.gateway_lifespan(app)
    loop.run_until_complete(lifespan.__aenter__())
    loop.run_until_complete(harness.run_sessions(app, wl))  # warm
    answered = operator.call(loop.run_until_complete, harness.run_sessions(app, wl))
    loop.run_until_complete(lifespan.__aexit__(None, None, None))
    if answered != wl.sessions * wl.turns:
        raise SystemExit(f"{answered} turns answered of {wl.sessions * wl.turns}")


def count(app: str, args: argparse.Namespace, valgrind: str) -> int:
    """Instructions of ``app``'s timed run."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [valgrind, "--tool=callgrind", "--collect-atstart=no",
               "--toggle-collect=_operator_call*", f"--callgrind-out-file={tmp}/out",
               sys.executable, __file__, "--child", app, "--sessions", str(args.sessions),
               "--turns", str(args.turns), "--input-tokens", str(args.input_tokens),
               "--output-tokens", str(args.output_tokens), "--tokenizer", str(args.tokenizer)]
        env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts every run
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    match = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    if proc.returncode != 0 or match is None:
        raise SystemExit(f"callgrind run of {app} failed:\n{proc.stderr[-3000:]}")
    return int(match.group(1))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("needs valgrind on PATH (Debian: apt install valgrind)")
    apps = [a for a in args.apps.split(",") if a]
    if not apps or any(a not in APPS for a in apps):
        raise SystemExit(f"--apps takes a subset of {','.join(APPS)}")
    turns = args.sessions * args.turns
    per_turn: dict[str, Any] = {app: count(app, args, valgrind) / turns for app in apps}
    rows = [[app, fmt(per_turn[app] / 1e3, 1)] for app in apps]
    if "floor" in per_turn and "tito" in per_turn:
        rows.append(["tito - floor (its own work)",
                     fmt((per_turn["tito"] - per_turn["floor"]) / 1e3, 1)])
    print_table(f"instructions per turn (thousands), in process: S={args.sessions} "
                f"T={args.turns} I={args.input_tokens} O={args.output_tokens}",
                ["app", "k instructions / turn"], rows,
                "callgrind, one timed run after a warm one; PYTHONHASHSEED=0; the harness's "
                "own client work (bodies, replies) is in both apps")
    if args.json is not None:
        args.json.write_text(json.dumps({"instructions_per_turn": per_turn}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
