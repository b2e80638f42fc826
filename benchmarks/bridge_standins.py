"""The bridge of a tool-calling agent's turn: with stand-ins against the real tool list.

An agent that calls tools gives every turn a new synthetic base (its previous calls), so
the bridge rendered its whole tool list every turn. :mod:`tito.render.standin` renders
stand-ins instead once a slot's checks agreed. This script times
:meth:`TemplateRenderer.bridge` (Qwen3, the fast tokenizer as the gateway loads it) for
a turn that answers one tool call with one tool result, with Claude Code's tool list (as
Chat functions: ``benchmarks/_harness_workload.py``), the stand-ins on and off, the two
alternated round by round; tokenization of the bridge included.

    python benchmarks/bridge_standins.py
    python benchmarks/bridge_standins.py --turns 1000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _harness_workload import Conversation
from _paths import QWEN3_DIR
from _tables import fmt, median, print_table

from tito.render import build_renderer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=300, help="timed turns per round and mode")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p.parse_args(argv)


def turn_of(k: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the previous assistant turn with its tool call, the tool result) of turn ``k``."""
    call = {"id": f"call_{k}", "type": "function",
            "function": {"name": "Bash", "arguments": json.dumps({"command": f"ls {k}"})}}
    return ({"role": "assistant", "content": "", "reasoning_content": f"step {k}",
             "tool_calls": [call]},
            [{"role": "tool", "tool_call_id": f"call_{k}", "content": f"listed {k} files"}])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    renderer = build_renderer("qwen3", args.tokenizer)
    tools = Conversation("chat", 1000, [1]).base["tools"]
    saved = renderer.standins
    times: dict[str, list[float]] = {"template": [], "stand-ins": []}
    k = 0
    for _ in range(args.rounds):
        for mode in times:
            renderer.standins = saved if mode == "stand-ins" else None
            for _ in range(3):  # the slot's checks, the skeleton's build
                k += 1
                previous, appended = turn_of(k)
                renderer.bridge(previous, renderer.primary_stop_id, appended, tools=tools)
            start = time.perf_counter()
            for _ in range(args.turns):
                k += 1
                previous, appended = turn_of(k)
                renderer.bridge(previous, renderer.primary_stop_id, appended, tools=tools)
            times[mode].append((time.perf_counter() - start) * 1e6 / args.turns)
    size = len(json.dumps(tools))
    rows = [[mode, fmt(median(v)), " ".join(fmt(x) for x in v)] for mode, v in times.items()]
    rows.append(["template / stand-ins", fmt(median(times["template"])
                                             / median(times["stand-ins"])) + "x", "-"])
    print_table(f"bridge of a tool-calling turn: {len(tools)} tools ({size:,} bytes)",
                ["", "µs per turn, median", "every round"], rows,
                caption=f"{args.rounds} alternated round(s) of {args.turns} turns; Qwen3")
    if args.json:
        args.json.write_text(json.dumps({"tools": len(tools), "tool_bytes": size,
                                         "us_per_turn": times}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
