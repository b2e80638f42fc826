"""The gateway's own work on an unstreamed turn's reply, and on a harness's first turn.

Issue 30's chat-nostream door spends its extra CPU per generated token: the SGLang
reply's checks (``parse_generate_response``: ids, logprobs, their stored arrays), the
completion's parse (decode and Hermes parse, Qwen3) and its reasoning count; and, once a
session, the first turn's render and encode of a Claude-Code-sized prompt (a ~20k-token
system prompt and 13 tools, the same in every session, then a message of its own). This
script times each in process on the replies the mock engine writes for the harness
(``[logprob, id, null]`` entries) of ``--tokens`` generated tokens, for this tree and for
each ``--root`` (another checkout, e.g. a ``git archive`` of the commit before), the trees
alternated round by round, each in a process of its own (medians of the rounds):

    python benchmarks/reply_cpu.py --root /tmp/base
    python benchmarks/reply_cpu.py --tokens 1000 4000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness_workload import conversations, directive
from _paths import QWEN3_DIR, REPO
from _tables import fmt, median, print_table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1000, 4000],
                   help="reasoning words of the timed replies (one token each)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=100, help="calls timed per piece a round")
    p.add_argument("--root", type=Path, action="append", default=[],
                   help="another tree to time the same way (repeatable)")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def timed(fn: Callable[[], object], repeat: int) -> float:
    """µs a call."""
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e6


def reply_pieces(renderer: Any, n: int, rng: random.Random, repeat: int
                 ) -> dict[str, float]:
    """µs of each reply piece for a completion of ``n`` reasoning words and a tool call."""
    import orjson

    from tito.engines.sglang_reply import parse_generate_response

    tok = renderer.tokenizer
    text = ("<think>\n" + directive(n, "Bash", 1).split("\n")[0][6:] + "\n</think>\n\n"
            '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls 1"}}\n'
            "</tool_call><|im_end|>")
    ids = tok.encode(text)
    body = orjson.dumps({"text": text, "output_ids": ids, "meta_info": {
        "id": "r", "finish_reason": {"type": "stop", "matched": ids[-1]},
        "prompt_tokens": 30000, "completion_tokens": len(ids), "cached_tokens": 0,
        "output_token_logprobs": [[-rng.random() * 3, i, None] for i in ids]}})
    result = parse_generate_response(orjson.loads(body), rid="r", vocab_size=tok.vocab_size)
    out = result.output_ids
    parsed = renderer.parse_turn(out, "stop", None)
    return {
        f"parse_generate_response/{n}": timed(lambda: parse_generate_response(
            orjson.loads(body), rid="r", vocab_size=tok.vocab_size), repeat)
        - timed(lambda: orjson.loads(body), repeat),
        f"parse_turn/{n}": timed(lambda: renderer.parse_turn(out, "stop", None), repeat),
        f"reasoning_tokens/{n}": timed(lambda: renderer.reasoning_tokens(out, parsed),
                                       repeat)}


def worker(args: argparse.Namespace) -> dict[str, float]:
    """One round in this process, with ``tito`` imported from ``args.worker``."""
    sys.path.insert(0, str(args.worker))
    import orjson

    from tito.render import build_renderer

    renderer = build_renderer("qwen3", args.tokenizer)
    thread = renderer.tokenizer.start_fast_encoder()
    if thread is not None:
        thread.join()
    rng = random.Random(0)
    out: dict[str, float] = {}
    for n in args.tokens:
        out.update(reply_pieces(renderer, n, rng, args.repeat))
    firsts = [orjson.loads(c.body()) for c in conversations("chat-nostream", 12, 1,
                                                           (1000, 4000), 20000)]
    for body in firsts[:2]:  # the first two sessions: the template compiled, the prompt seen
        renderer.render_prompt(body["messages"], tools=body["tools"])
    start = time.perf_counter()
    for body in firsts[2:]:
        renderer.render_prompt(body["messages"], tools=body["tools"])
    out["first turn"] = (time.perf_counter() - start) / len(firsts[2:]) * 1e6
    return out


def run_round(root: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--worker", str(root), "--repeat", str(args.repeat),
           "--tokenizer", str(args.tokenizer), "--tokens", *map(str, args.tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    figures: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args)))
        return
    roots = [REPO, *args.root]
    rounds: dict[str, list[dict[str, float]]] = {str(r): [] for r in roots}
    for k in range(args.rounds):
        for root in roots:
            rounds[str(root)].append(run_round(root, args))
        print(f"round {k + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    result: dict[str, dict[str, float]] = {
        root: {key: median([r[key] for r in runs]) for key in runs[0]}
        for root, runs in rounds.items()}
    keys = list(next(iter(result.values())))
    rows: list[list[Any]] = [[key, *(fmt(result[str(r)][key], 1) for r in roots)]
                             for key in keys]
    print_table("the gateway's work on an unstreamed reply, µs (median of the rounds)",
                ["piece/generated tokens", *(f"tree {i}: {r}" for i, r in enumerate(roots))],
                rows, caption="parse_generate_response: past the reply's orjson.loads; "
                "first turn: render_prompt of a harness's first body, sessions 3-12")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
