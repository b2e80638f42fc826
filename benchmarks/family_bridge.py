"""A family's bridge and startup self-check cost, next to the family it derives from.

For each (base, new) pair, over the families' stand-in tokenizers: the bridge of a tool
result after a tool call (µs per bridge, best of R rounds of N bridges; the base render and
the skeletons cached as in serving) and one run of the append-only verifier (the gateway's
startup self-check, seconds, best of R). Families are measured interleaved in each round,
so the ratios hold on a shared machine.

    python benchmarks/family_bridge.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from _tables import fmt, print_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tito.render import TemplateRenderer, build_renderer
from tito.render.verify import verify_renderer

PAIRS = (("glm47", "glm5"), ("kimi_k2", "kimi_k25"), ("kimi_k2", "kimi_k3"))
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
PREVIOUS = {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [CALL]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--bridges", type=int, default=200, help="bridges per round")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p.parse_args(argv)


def bridge_us(renderer: TemplateRenderer, n: int) -> float:
    last = renderer.render_completion(PREVIOUS, tools=TOOLS)[-1]
    start = time.perf_counter()
    for i in range(n):
        renderer.bridge(PREVIOUS, last, [{"role": "tool", "tool_call_id": "call_1",
                                          "content": f"result {i}"}], tools=TOOLS)
    return (time.perf_counter() - start) / n * 1e6


def verify_s(renderer: TemplateRenderer) -> float:
    start = time.perf_counter()
    verify_renderer(renderer)
    return time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    families = sorted({f for pair in PAIRS for f in pair})
    renderers = {f: build_renderer(f, "standin") for f in families}
    best: dict[str, dict[str, float]] = {f: {"bridge_us": float("inf"), "verify_s": float("inf")}
                                         for f in families}
    for _ in range(args.rounds):
        for family in families:  # interleaved
            r = renderers[family]
            best[family]["bridge_us"] = min(best[family]["bridge_us"], bridge_us(r, args.bridges))
            best[family]["verify_s"] = min(best[family]["verify_s"], verify_s(r))
    return best


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    best = measure(args)
    rows: list[list[Any]] = []
    figures: list[dict[str, Any]] = []
    for base, new in PAIRS:
        b, n = best[base], best[new]
        ratio_bridge, ratio_verify = n["bridge_us"] / b["bridge_us"], n["verify_s"] / b["verify_s"]
        rows.append([f"{new} / {base}", fmt(n["bridge_us"], 0), fmt(b["bridge_us"], 0),
                     fmt(ratio_bridge), fmt(n["verify_s"], 3), fmt(b["verify_s"], 3),
                     fmt(ratio_verify)])
        figures.append({"new": new, "base": base, **{f"new_{k}": v for k, v in n.items()},
                        **{f"base_{k}": v for k, v in b.items()},
                        "bridge_ratio": ratio_bridge, "verify_ratio": ratio_verify})
    print_table("family bridge and self-check cost (stand-in tokenizers)",
                ["pair", "bridge µs", "base µs", "ratio", "verify s", "base s", "ratio"], rows)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
