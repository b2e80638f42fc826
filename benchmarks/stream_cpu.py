"""Gateway CPU per generated token of a streamed turn, short and long (issue 30: flat in
the output length), in both of SGLang's stream modes.

``tito mock-engine`` streams a ``LONG n`` completion (``--token-latency-ms`` a token, so it
comes in many chunks, coalesced as SGLang does when the reader is behind), cumulative
(SGLang's default) or incremental (``--incremental-streaming-output``); the gateway in
front streams it to the client on one door. For each length the gateway's on-CPU time of
the whole turn (``/proc/<pid>/task/*/schedstat``) is divided by the tokens; the last
column is the per-token figure over the shortest length's. ``engine chunks`` is how many
chunks the mock sent for the turn (median): in the cumulative mode each repeats every id
so far, so the bytes the gateway reads grow with their count, which depends on how far
behind the reader was (both processes share the machine's cores).

    python benchmarks/stream_cpu.py
    python benchmarks/stream_cpu.py --lengths 1024 16384 65536 --door messages
"""

from __future__ import annotations

import argparse
import http.client
import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from _paths import QWEN3_DIR
from _processes import cpu_ns, start_gateway, start_mock
from _tables import fmt, median, print_table

DOORS = {
    "chat": ("v1/chat/completions", lambda n: {
        "messages": [{"role": "user", "content": f"LONG {n}"}], "max_tokens": n,
        "stream": True}),
    "messages": ("v1/messages", lambda n: {
        "model": "m", "max_tokens": n, "stream": True,
        "messages": [{"role": "user", "content": f"LONG {n}"}]}),
    "responses": ("v1/responses", lambda n: {
        "input": f"LONG {n}", "max_output_tokens": n, "stream": True}),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 16384],
                   help="output tokens of the streamed turns")
    p.add_argument("--repeat", type=int, default=3, help="turns per length")
    p.add_argument("--door", choices=sorted(DOORS), default="chat")
    p.add_argument("--modes", nargs="+", choices=["cumulative", "incremental"],
                   default=["cumulative", "incremental"], help="mock engine stream modes")
    p.add_argument("--token-latency-ms", type=float, default=0.05,
                   help="mock latency per output token")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def stream_turn(url: str, door: str, n: int) -> int:
    """Stream one ``LONG n`` turn in a new session to its end; its data events."""
    with urllib.request.urlopen(urllib.request.Request(url + "/sessions", method="POST")) as r:
        sid = json.loads(r.read())["session_id"]
    path, body = DOORS[door]
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    conn.request("POST", f"/sessions/{sid}/{path}", json.dumps(body(n)),
                 {"content-type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    events = sum(line.startswith(b"data:") for line in resp)
    conn.close()
    return events


def engine_chunks(url: str) -> float:
    """The chunks the mock streamed for its latest request."""
    with urllib.request.urlopen(url + "/mock/requests") as r:
        log = json.loads(r.read())
    return float(log[-1].get("stream_chunks", 0)) if log else 0.0


def measure(args: argparse.Namespace, mode: str) -> list[dict[str, Any]]:
    extra = ("--context-length", str(max(args.lengths) + 4096))
    if mode == "incremental":
        extra += ("--incremental-streaming-output",)
    engine = start_mock(args.tokenizer, token_latency_ms=args.token_latency_ms, extra=extra)
    gateway = start_gateway(args.tokenizer, engine.url)
    rows: list[dict[str, Any]] = []
    try:
        stream_turn(gateway.url, args.door, 64)  # warm up
        for n in args.lengths:
            per_token, chunks = [], []
            for _ in range(args.repeat):
                before = cpu_ns(gateway.pid)
                stream_turn(gateway.url, args.door, n)
                per_token.append((cpu_ns(gateway.pid) - before) / 1e3 / n)
                chunks.append(engine_chunks(engine.url))
            rows.append({"mode": mode, "door": args.door, "tokens": n,
                         "cpu_us_per_token": median(per_token),
                         "engine_chunks": median(chunks)})
    finally:
        gateway.stop()
        engine.stop()
    base = rows[0]["cpu_us_per_token"]
    for row in rows:
        row["ratio"] = row["cpu_us_per_token"] / base
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rows = [row for mode in args.modes for row in measure(args, mode)]
    print_table(f"gateway CPU per streamed token ({args.door}, median of {args.repeat})",
                ["mode", "tokens", "engine chunks", "CPU us/token", f"x vs {args.lengths[0]}"],
                [[r["mode"], r["tokens"], f"{r['engine_chunks']:.0f}",
                  fmt(r["cpu_us_per_token"], 1), fmt(r["ratio"])] for r in rows])
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
