"""Event-loop stalls: how long a cheap request (``GET /health``) waits while one big request
runs on the same gateway — a ``count_tokens`` of a long prompt, a ``/samples`` with a big
``metadata``. A request whose work runs on the event loop makes every session wait for
all of it; worked on in the gateway's worker pool, only its single C calls that hold the
interpreter lock (one ``orjson.loads`` of the whole body) still delay the loop.

``/health`` is polled every 5 ms while the big request runs; the figure is the longest
wait. Compare two trees with ``TITO_BENCH_ROOT=/path/to/other/checkout``.

    python benchmarks/loop_stall.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from _paths import QWEN3_DIR
from _processes import start_gateway, start_mock
from _tables import fmt, median, print_table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--words", type=int, default=400_000,
                   help="words of the count_tokens prompt (~7.7 bytes each)")
    p.add_argument("--rows", type=int, default=300_000,
                   help="rows of the samples metadata (~49 bytes each)")
    p.add_argument("--repeat", type=int, default=3, help="big requests per row")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


async def longest_wait(http: httpx.AsyncClient, stop: asyncio.Event) -> float:
    worst = 0.0
    while not stop.is_set():
        sent = time.perf_counter()
        await http.get("/health")
        worst = max(worst, time.perf_counter() - sent)
        await asyncio.sleep(0.005)
    return worst


async def one(http: httpx.AsyncClient, url: str, body: bytes) -> tuple[float, float]:
    """(seconds the big request took, longest /health wait meanwhile)."""
    stop = asyncio.Event()
    probe = asyncio.create_task(longest_wait(http, stop))
    await asyncio.sleep(0.05)
    sent = time.perf_counter()
    resp = await http.post(url, content=body, headers={"content-type": "application/json"})
    took = time.perf_counter() - sent
    stop.set()
    worst = await probe
    if resp.status_code != 200:
        raise SystemExit(f"{url}: HTTP {resp.status_code} {resp.text[:300]}")
    return took, worst


def bodies(args: argparse.Namespace) -> dict[str, bytes]:
    prompt = " ".join(f"w{i}" for i in range(args.words))
    rows = [{"k": i, "v": [i, i + 1, {"x": "y" * 8}]} for i in range(args.rows)]
    return {
        "count_tokens": orjson.dumps({"model": "m", "messages": [
            {"role": "user", "content": prompt}]}),
        "samples": orjson.dumps({"metadata": {"rows": rows}}),
    }


async def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        first = await http.post(f"/sessions/{sid}/v1/chat/completions",
                                json={"messages": [{"role": "user", "content": "SAY hi"}]})
        first.raise_for_status()
        paths = {"count_tokens": f"/sessions/{sid}/v1/messages/count_tokens",
                 "samples": f"/sessions/{sid}/samples"}
        for name, body in bodies(args).items():
            runs = [await one(http, paths[name], body) for _ in range(args.repeat)]
            figures[name] = {"body_mb": len(body) / 1e6,
                             "request_s": [r[0] for r in runs],
                             "longest_health_wait_ms": [r[1] * 1000 for r in runs]}
    return figures


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    engine = start_mock(args.tokenizer)
    gateway = start_gateway(args.tokenizer, engine.url, "--max-body-bytes", str(256 << 20))
    try:
        figures = asyncio.run(run(gateway.url, args))
    finally:
        gateway.stop()
        engine.stop()
    rows = [[name, fmt(fig["body_mb"], 1), fmt(median(fig["request_s"])),
             fmt(median(fig["longest_health_wait_ms"]), 0),
             fmt(max(fig["longest_health_wait_ms"]), 0)]
            for name, fig in figures.items()]
    print_table(f"event-loop stalls: /health while one big request runs ({args.repeat} runs)",
                ["big request", "body (MB)", "its time p50 (s)", "longest /health wait p50 (ms)",
                 "max (ms)"], rows)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
