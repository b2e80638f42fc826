"""Scale on one machine: many live long sessions in one gateway worker.

Through the real server (``tito serve``, one worker, + ``tito mock-engine``): a load
generator in its own process builds ``--sessions`` sessions of ``--turns`` turns, each
turn a long tool output (``-I`` tokens, with a ``SAY`` directive) and a long scripted reply
(``-O`` tokens): ~``T x (I + O)`` tokens per session (default 4 x (4,200 + 4,096) = 33k),
and leaves them alive. Figures:

- **bytes per stored token**: gateway RSS growth (``VmRSS`` after - before the sessions)
  / stored tokens (``tito_stored_tokens`` of ``/metrics``), plus the marginal figure of
  the second half of the sessions (past the holes the startup left);
- **p99 added latency of a small turn**: ``--probes`` probes, each one small chat turn on
  a fresh session (created and deleted untimed) and the same prompt sent straight to the
  engine's ``/generate`` right after; added latency = gateway turn - direct call, per
  pair. Measured on the gateway before the sessions, then while every big session is
  live, alternating probe by probe with a second gateway (same engine) that stays empty:
  the machine's noise then hits both alike.

When the machine cannot hold the target (10,000 sessions of 32k tokens) the table also
gives the linear projection: RSS before + tokens x marginal bytes per token.

    python benchmarks/scale_sessions.py                     # 1,000 x 33k tokens
    python benchmarks/scale_sessions.py -S 10000 -T 1 -I 1200 -O 1024   # 10,000 sessions
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
from _load import SAMPLING, run_phase
from _paths import QWEN3_DIR
from _processes import http_json, peak_rss_bytes, rss_bytes, start_gateway, start_mock
from _tables import fmt, print_table
from _workload import build_workload

TARGET_SESSIONS = 10_000
TARGET_TOKENS = 32_768
PROBE = [{"role": "system", "content": "You are a probe."},
         {"role": "user", "content": "SAY the quick brown fox jumps over the lazy dog"}]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sessions", "-S", type=int, default=1000, help="sessions kept alive")
    p.add_argument("--turns", "-T", type=int, default=4, help="turns per session")
    p.add_argument("--input-tokens", "-I", type=int, default=4200,
                   help="content tokens of the tool output appended every turn")
    p.add_argument("--output-tokens", "-O", type=int, default=4096,
                   help="tokens generated per turn")
    p.add_argument("--concurrency", type=int, default=16, help="sessions built at once")
    p.add_argument("--probes", type=int, default=400,
                   help="small turns timed on the empty and on the full gateway")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def _post(url: str, body: bytes) -> tuple[float, Any]:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        raw = resp.read()
    return (time.perf_counter() - t0) * 1000, orjson.loads(raw)


def probe(gateways: list[str], engine: str, prompt_ids: list[int],
          n: int) -> list[dict[str, float]]:
    """``n`` small turns (fresh session each) and their direct engine calls, paired, on
    each of ``gateways`` in turn (interleaved: the machine's noise hits them alike)."""
    chat = orjson.dumps({"messages": PROBE, "max_tokens": 32})
    direct = orjson.dumps({"input_ids": prompt_ids, "return_logprob": True,
                           "logprob_start_len": -1, "stream": False,
                           "sampling_params": {**SAMPLING, "max_new_tokens": 32}})
    turns: list[list[float]] = [[] for _ in gateways]
    added: list[list[float]] = [[] for _ in gateways]
    for _ in range(n):
        for k, gateway in enumerate(gateways):
            sid = http_json("POST", gateway + "/sessions")["session_id"]
            ms, _reply = _post(f"{gateway}/sessions/{sid}/v1/chat/completions", chat)
            engine_ms, _ = _post(engine + "/generate", direct)
            http_json("DELETE", f"{gateway}/sessions/{sid}")
            turns[k].append(ms)
            added[k].append(ms - engine_ms)
    load = os.getloadavg()[0]
    return [{"load_avg": load, "turn_p50": _pct(t, 50), "turn_p99": _pct(t, 99),
             "added_p50": _pct(a, 50), "added_p99": _pct(a, 99),
             "added_mean": statistics.fmean(a)} for t, a in zip(turns, added, strict=True)]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def stored(gateway: str) -> dict[str, float]:
    with urllib.request.urlopen(gateway + "/metrics", timeout=60) as resp:
        text = resp.read().decode()
    out = {}
    for name in ("tito_stored_tokens", "tito_stored_bytes", "tito_sessions"):
        m = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else float("nan")
    return out


def fill(url: str, pid: int, wl: Any) -> tuple[float, list[str]]:
    phase = run_phase("gateway", url, wl, {"gateway": pid})
    if phase.load.errors:
        raise SystemExit(f"load errors: {phase.load.errors[:3]}")
    return phase.load.wall_s, phase.load.session_ids


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from tito.render import build_renderer

    prompt_ids = list(build_renderer("qwen3", args.tokenizer).render_prompt(PROBE))
    half = build_workload(args.tokenizer, sessions=max(1, args.sessions // 2),
                          turns=args.turns, input_tokens=args.input_tokens,
                          output_tokens=args.output_tokens)
    half.concurrency = args.concurrency
    half.keep_sessions = True
    context = args.turns * (half.content_tokens + args.output_tokens) + 4096
    mock = start_mock(args.tokenizer, extra=("--context-length", str(context)))
    try:
        flags = ("--max-sessions", str(2 * args.sessions + 16), "--session-ttl", "86400")
        gw = start_gateway(args.tokenizer, mock.url, *flags)
        idle = start_gateway(args.tokenizer, mock.url, *flags)  # stays empty: the control
        try:
            probe([gw.url, idle.url], mock.url, prompt_ids, 20)  # warm-up
            before = probe([gw.url], mock.url, prompt_ids, args.probes)[0]
            rss0 = rss_bytes(gw.pid)
            first_s, _ = fill(gw.url, gw.pid, half)
            mid, rss1 = stored(gw.url), rss_bytes(gw.pid)
            second_s, _ = fill(gw.url, gw.pid, half)
            end, rss2 = stored(gw.url), rss_bytes(gw.pid)
            full, empty = probe([gw.url, idle.url], mock.url, prompt_ids, args.probes)
            peak = peak_rss_bytes(gw.pid)
        finally:
            idle.stop()
            gw.stop()
    finally:
        mock.stop()
    tokens = end["tito_stored_tokens"]
    marginal = (rss2 - rss1) / max(1.0, tokens - mid["tito_stored_tokens"])
    return {"sessions": end["tito_sessions"], "tokens": tokens,
            "tokens_per_session": tokens / max(1.0, end["tito_sessions"]),
            "rss_before_mb": rss0 / 2**20, "rss_after_mb": rss2 / 2**20,
            "peak_rss_mb": peak / 2**20, "bytes_per_token": (rss2 - rss0) / tokens,
            "marginal_bytes_per_token": marginal,
            "stored_bytes_per_token": end["tito_stored_bytes"] / tokens,
            "fill_s": first_s + second_s, "before": before, "empty": empty, "full": full}


def report(f: dict[str, Any]) -> None:
    target_tokens = TARGET_SESSIONS * TARGET_TOKENS
    projected = f["rss_before_mb"] + target_tokens * f["marginal_bytes_per_token"] / 2**20
    print_table(
        f"{f['sessions']:,.0f} live sessions x {f['tokens_per_session']:,.0f} tokens, "
        "one gateway worker",
        ["", "value"],
        [["stored tokens", f"{f['tokens']:,.0f}"],
         ["RSS before / after (MiB)", f"{f['rss_before_mb']:.0f} / {f['rss_after_mb']:.0f}"],
         ["peak RSS (MiB)", f"{f['peak_rss_mb']:.0f}"],
         ["RSS growth per stored token (bytes)", fmt(f["bytes_per_token"], 2)],
         ["marginal bytes per token (second half of the sessions)",
          fmt(f["marginal_bytes_per_token"], 2)],
         ["tito_stored_bytes / tito_stored_tokens (ids + logprobs)",
          fmt(f["stored_bytes_per_token"], 2)],
         [f"projected RSS, {TARGET_SESSIONS:,} x {TARGET_TOKENS:,} tokens (GiB)",
          fmt(projected / 1024, 2)],
         ["build time (s)", fmt(f["fill_s"], 0)]],
        caption="target: <= 16 bytes per stored token; projection = RSS before + "
                "tokens x marginal bytes per token")
    rows = []
    for label, key in (("this gateway before the sessions", "before"),
                       ("all sessions live", "full"),
                       ("a second, empty gateway (interleaved)", "empty")):
        p = f[key]
        rows.append([label, fmt(p["turn_p50"], 2), fmt(p["turn_p99"], 2),
                     fmt(p["added_p50"], 2), fmt(p["added_p99"], 2), fmt(p["load_avg"], 1)])
    print_table("small turn (fresh session, 19-token prompt, 12-token reply), ms",
                ["gateway", "turn p50", "turn p99", "added p50", "added p99",
                 "machine load (1 min)"], rows,
                caption="added = gateway turn - the same prompt straight to the engine, "
                        "per pair; the last two rows alternate probe by probe; target: "
                        "added p99 <= 5 ms")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.tokenizer.is_dir():
        print(f"no tokenizer folder {args.tokenizer}", file=sys.stderr)
        return 2
    figures = measure(args)
    report(figures)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
