"""Serializing a turn's prompt ids: whole, against spliced onto the previous prompt's text.

The SGLang and vLLM clients send the prompt as a JSON list of ids. Serialized whole, that
costs O(context) every turn; :mod:`tito.engines.prompt_json` builds it on the session's
previous prompt (O(new ids)). This script plays S sessions of T turns, interleaved as a
gateway serves them, each turn's prompt growing by G ids from a first prompt of F ids, and
prints the µs per turn of both ways (best of R rounds) and the final context length.

    python benchmarks/prompt_json.py                 # contexts of ~3k, ~12k and ~30k ids
    python benchmarks/prompt_json.py --growth 141 --turns 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from _tables import fmt, print_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tito.engines.prompt_json import PromptJson


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, nargs="+", default=[20, 80, 200],
                   help="turns per session (one table row each)")
    p.add_argument("--growth", type=int, default=141, help="new ids a turn (output + bridge)")
    p.add_argument("--first", type=int, default=600, help="ids of the first prompt")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p.parse_args(argv)


def prompts(first: int, growth: int, turns: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = [rng.integers(0, 150_000, first, dtype=np.int32)]
    for _ in range(turns - 1):
        out.append(np.concatenate([out[-1], rng.integers(0, 150_000, growth, dtype=np.int32)]))
    return out


def per_turn(serialize: Callable[[str, np.ndarray], bytes], turns: list[np.ndarray],
             sessions: int) -> float:
    """µs per call, the sessions' turns interleaved (turn 0 of every session, then turn 1)."""
    keys = [f"s{i}" for i in range(sessions)]
    start = time.perf_counter()
    for ids in turns:
        for key in keys:
            serialize(key, ids)
    return (time.perf_counter() - start) * 1e6 / (len(turns) * sessions)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[list[Any]] = []
    figures = []
    for turns in args.turns:
        seq = prompts(args.first, args.growth, turns)
        check = PromptJson()
        for ids in seq:  # the spliced text is the whole text, every turn
            assert check.ids_json("s", ids) == orjson.dumps(ids.tolist())
        whole, spliced = [], []
        for _ in range(max(1, args.rounds)):
            whole.append(per_turn(
                lambda _key, ids: orjson.dumps(ids, option=orjson.OPT_SERIALIZE_NUMPY),
                seq, args.sessions))
            spliced.append(per_turn(PromptJson().ids_json, seq, args.sessions))
        w, s = min(whole), min(spliced)
        rows.append([str(turns), f"{len(seq[-1]):,}", fmt(w), fmt(s), f"{w / s:.1f}x"])
        figures.append({"turns": turns, "final_context": len(seq[-1]),
                        "whole_us": w, "spliced_us": s})
    print_table(f"prompt ids as JSON, per turn: S={args.sessions} F={args.first} "
                f"G={args.growth}", ["turns", "final context (ids)", "whole (µs)",
                                     "spliced (µs)", "whole / spliced"], rows,
                f"best of {args.rounds} round(s); the sessions' turns interleaved; µs per "
                "turn averaged over the session's turns")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
