"""Harness-shaped traffic (issue 30): gateway CPU per turn and per streamed token, and the
time to first token it adds, against a bare streaming proxy fed the same bodies.

Doors (``--doors``): ``messages`` (Claude Code's bodies: a ~20k-token system prompt, 13
tools, ``cache_control`` moving to the newest message, streamed), ``responses`` (Codex's:
typed items, reasoning and ``function_call`` echoed back, streamed), ``chat`` (streamed)
and ``chat-nostream``. S sessions play T turns in lock step (every session's turn k, then
turn k+1), each turn streaming 1k-4k tokens (``--tokens``: reasoning, then a tool call)
from ``tito mock-engine`` at a fixed rate (``--token-latency-ms``). Per door, the gateway
plays the conversations first (the client parses its stream and echoes the reply, as the
harness does); the benchmark reads each turn's prompt ids back from the sessions; then the
bare streaming proxy (``benchmarks/streaming_proxy.py``: body parse, precomputed ids, the
door's SSE events per engine chunk) gets the very same bodies; then the gateway again
(fresh sessions), and so on (``--repeat`` pairs): both measured in the same run.

CPU is each server's on-CPU time (``/proc/<pid>/task/*/schedstat``) over each turn's
phase, so the tables show how it grows with the turn count; per token = CPU / tokens
generated in the phase. TTFT: from sending the request to the first delta event.

    python benchmarks/harness_traffic.py                       # S=32 T=20, all doors
    python benchmarks/harness_traffic.py -S 8 -T 6 --doors messages --tokens 1000 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from _harness_workload import DOORS, Conversation, conversations
from _paths import QWEN3_DIR
from _processes import Proc, cpu_ns, http_json, start_gateway, start_mock, start_server
from _profiling import PySpy, by_package, top_frames
from _tables import fmt, median, print_table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sessions", "-S", type=int, default=32)
    p.add_argument("--turns", "-T", type=int, default=20)
    p.add_argument("--tokens", type=int, nargs=2, default=[1000, 4000],
                   metavar=("MIN", "MAX"), help="reasoning words streamed per turn")
    p.add_argument("--system-tokens", type=int, default=20000,
                   help="the system prompt padded to about this many tokens")
    p.add_argument("--doors", nargs="+", choices=sorted(DOORS), default=list(DOORS))
    p.add_argument("--repeat", type=int, default=1, help="gateway/proxy pairs per door")
    p.add_argument("--token-latency-ms", type=float, default=0.25,
                   help="mock latency per output token")
    p.add_argument("--stream-mode", choices=["incremental", "cumulative"],
                   default="incremental", help="the mock's SGLang stream mode (cumulative "
                   "chunks repeat every id so far: the proxy would read them O(n^2))")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--py-spy", type=Path, default=None, metavar="PREFIX",
                   help="profile the gateway's runs with py-spy --gil (PREFIX-<door>.txt); "
                        "inflates that run's CPU")
    return p.parse_args(argv)


@dataclass
class Turn:
    """What the client of one turn read."""

    ttft: float = float("nan")
    reply: Any = None
    body: bytes = b""


@dataclass
class Run:
    mode: str
    cpu_ns: list[int] = field(default_factory=list)
    """The server's CPU in each turn's phase."""
    ttft: list[list[float]] = field(default_factory=list)
    """Each phase's TTFTs (seconds)."""


# -- reading a door's stream --------------------------------------------------------------
def _messages_reply(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    parts: list[str] = []
    for e in events:
        if e["type"] == "content_block_start":
            blocks.append(dict(e["content_block"]))
            parts.append("")
        elif e["type"] == "content_block_delta":
            d, b = e["delta"], blocks[-1]
            kind = d["type"]
            if kind == "input_json_delta":
                parts[-1] += d["partial_json"]
            else:
                key = {"text_delta": "text", "thinking_delta": "thinking",
                       "signature_delta": "signature"}[kind]
                b[key] = b.get(key, "") + d[key]
    for b, raw in zip(blocks, parts, strict=True):
        if b["type"] == "tool_use":
            b["input"] = json.loads(raw) if raw else {}
    return blocks


def _chat_reply(events: list[dict[str, Any]]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict[str, Any]] = {}
    for e in events:
        for choice in e.get("choices") or ():
            d = choice["delta"]
            msg["content"] += d.get("content") or ""
            if d.get("reasoning_content"):
                msg["reasoning_content"] = msg.get("reasoning_content", "") + \
                    d["reasoning_content"]
            for c in d.get("tool_calls") or ():
                call = calls.setdefault(c["index"], {"id": "", "type": "function", "function":
                                                     {"name": "", "arguments": ""}})
                call["id"] += c.get("id") or ""
                call["function"]["name"] += (c.get("function") or {}).get("name") or ""
                call["function"]["arguments"] += (c.get("function") or {}).get(
                    "arguments") or ""
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


def reply_of(door: str, events: list[dict[str, Any]]) -> Any:
    if door == "messages":
        return _messages_reply(events)
    if door == "responses":
        done = [e for e in events if e.get("type") == "response.completed"]
        if not done:
            raise RuntimeError(f"no response.completed: {str(events[-1:])[:600]}")
        return done[-1]["response"]["output"]
    return _chat_reply(events)


def _is_delta(event: dict[str, Any]) -> bool:
    kind = event.get("type", "")
    if kind:
        return kind == "content_block_delta" or kind.endswith(".delta")
    return any(c["delta"].get("content") or c["delta"].get("reasoning_content")
               for c in event.get("choices") or ())


async def play_turn(http: aiohttp.ClientSession, url: str, body: bytes, key: str,
                    door: str, parse: bool) -> Turn:
    turn = Turn(body=body)
    start = time.perf_counter()
    headers = {"content-type": "application/json", "x-bench-key": key}
    async with http.post(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.read())[:400]!r}")
        if door == "chat-nostream":
            data = orjson.loads(await resp.read())
            turn.ttft = time.perf_counter() - start
            turn.reply = data["choices"][0]["message"] if parse else None
            return turn
        events = []
        async for line in resp.content:
            if not line.startswith(b"data:") or line.startswith(b"data: [DONE]"):
                continue
            if turn.ttft != turn.ttft or parse:  # NaN: the first delta is still to come
                event = orjson.loads(line[5:])
                if turn.ttft != turn.ttft and _is_delta(event):
                    turn.ttft = time.perf_counter() - start
                if parse:
                    events.append(event)
    if parse:
        turn.reply = reply_of(door, events)
    return turn


# -- one run of a door -------------------------------------------------------------------
async def run_gateway(gw: Proc, door: str, convs: list[Conversation], turns: int
                      ) -> tuple[Run, list[str], list[list[bytes]]]:
    run, bodies = Run("tito"), [[] for _ in convs]
    async with aiohttp.ClientSession(read_bufsize=1 << 20) as http:
        sids = []
        for _ in convs:
            async with http.post(gw.url + "/sessions") as r:
                sids.append((await r.json())["session_id"])
        for k in range(turns):
            before = cpu_ns(gw.pid)
            got = await asyncio.gather(*(
                play_turn(http, f"{gw.url}/sessions/{sid}/{DOORS[door]}", c.body(), "",
                          door, True) for sid, c in zip(sids, convs, strict=True)))
            run.cpu_ns.append(cpu_ns(gw.pid) - before)
            run.ttft.append([t.ttft for t in got])
            for i, (c, t) in enumerate(zip(convs, got, strict=True)):
                bodies[i].append(t.body)
                c.answer(t.reply, k)
    return run, sids, bodies


async def run_proxy(proxy: Proc, door: str, bodies: list[list[bytes]], turns: int) -> Run:
    run = Run("proxy")
    async with aiohttp.ClientSession(read_bufsize=1 << 20) as http:
        for k in range(turns):
            before = cpu_ns(proxy.pid)
            got = await asyncio.gather(*(
                play_turn(http, f"{proxy.url}/{DOORS[door]}", b[k], f"{door}/{i}/{k}", door,
                          False) for i, b in enumerate(bodies)))
            run.cpu_ns.append(cpu_ns(proxy.pid) - before)
            run.ttft.append([t.ttft for t in got])
    return run


def turn_ids(gw: Proc, door: str, sids: list[str]) -> tuple[dict[str, list[int]], list[int]]:
    """({door/session/turn: the prompt ids the gateway sent}, output tokens per turn)."""
    table: dict[str, list[int]] = {}
    outputs: list[int] = []
    for i, sid in enumerate(sids):
        records: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            page = http_json("GET", f"{gw.url}/sessions/{sid}?include_ids=true&limit=1000"
                                    f"&offset={offset}")
            records += page["records"]
            offset = page["page"]["next_offset"]
        ids: list[int] = []
        for k, rec in enumerate(records):
            if rec.get("drop"):
                raise SystemExit("records with a trailing trim: not supported here")
            ids = ids + rec["bridge_ids"]
            table[f"{door}/{i}/{k}"] = ids
            ids = ids + rec["output_ids"]
            if len(outputs) <= k:
                outputs.append(0)
            outputs[k] += len(rec["output_ids"])
    return table, outputs


def measure_door(args: argparse.Namespace, door: str, gw: Proc, proxy: Proc
                 ) -> dict[str, Any]:
    runs: list[Run] = []
    outputs: list[int] = []
    for r in range(args.repeat):
        convs = conversations(door, args.sessions, args.turns, tuple(args.tokens),
                              args.system_tokens)
        spy = None
        if args.py_spy is not None and r == 0:
            spy = PySpy(gw.pid, Path(f"{args.py_spy}-{door}.txt"))
        run, sids, bodies = asyncio.run(run_gateway(gw, door, convs, args.turns))
        if spy is not None:
            spy.stop()
            print_profile(spy.out, door)
        table, outputs = turn_ids(gw, door, sids)
        http_json("POST", proxy.url + "/bench/ids", orjson.dumps(table))
        for sid in sids:
            http_json("DELETE", f"{gw.url}/sessions/{sid}")
        runs += [run, asyncio.run(run_proxy(proxy, door, bodies, args.turns))]
        print(f"{door}: pair {r + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    return summarize(door, runs, outputs, args)


def print_profile(path: Path, door: str) -> None:
    own, incl = top_frames(path, 20)
    print_table(f"gateway, {door}: top self frames (py-spy --gil)", ["frame", "share"], own)
    print_table(f"gateway, {door}: tito frames, inclusive", ["frame", "share"], incl)
    print_table(f"gateway, {door}: self samples by package", ["package", "share"],
                by_package(path))


def summarize(door: str, runs: list[Run], outputs: list[int], args: argparse.Namespace
              ) -> dict[str, Any]:
    def per_phase(mode: str) -> list[float]:  # median over the runs, ns per phase
        rs = [r for r in runs if r.mode == mode]
        return [median([r.cpu_ns[k] for r in rs]) for k in range(args.turns)]

    def ttft(mode: str, ks: range) -> float:
        return median([t for r in runs if r.mode == mode for k in ks for t in r.ttft[k]])

    tito, proxy = per_phase("tito"), per_phase("proxy")
    s, t = args.sessions, args.turns
    third = max(1, t // 3)
    phases = {"first": range(0, third), "last": range(t - third, t), "all": range(t)}
    out: dict[str, Any] = {"door": door, "tokens_per_turn": sum(outputs) / (s * t)}
    for name, ks in phases.items():
        tokens = sum(outputs[k] for k in ks)
        out[name] = {
            "tito_ms_per_turn": sum(tito[k] for k in ks) / 1e6 / (s * len(ks)),
            "proxy_ms_per_turn": sum(proxy[k] for k in ks) / 1e6 / (s * len(ks)),
            "tito_us_per_token": sum(tito[k] for k in ks) / 1e3 / tokens,
            "proxy_us_per_token": sum(proxy[k] for k in ks) / 1e3 / tokens,
            "tito_ttft_ms": ttft("tito", ks) * 1e3, "proxy_ttft_ms": ttft("proxy", ks) * 1e3}
        out[name]["ratio"] = out[name]["tito_ms_per_turn"] / out[name]["proxy_ms_per_turn"]
    return out


def print_results(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    rows = []
    for r in results:
        for name in ("first", "last", "all"):
            f = r[name]
            rows.append([r["door"], name, fmt(f["tito_ms_per_turn"], 3),
                         fmt(f["proxy_ms_per_turn"], 3), fmt(f["ratio"]),
                         fmt(f["tito_us_per_token"], 1), fmt(f["proxy_us_per_token"], 1),
                         fmt(f["tito_ttft_ms"], 1), fmt(f["proxy_ttft_ms"], 1),
                         fmt(f["tito_ttft_ms"] - f["proxy_ttft_ms"], 1)])
    print_table(
        f"harness-shaped traffic: S={args.sessions} T={args.turns}, {args.tokens[0]}-"
        f"{args.tokens[1]} reasoning words a turn, system ~{args.system_tokens} tokens",
        ["door", "turns", "tito ms/turn", "proxy ms/turn", "tito/proxy", "tito us/token",
         "proxy us/token", "tito TTFT ms", "proxy TTFT ms", "added TTFT ms"], rows,
        caption="turns: the first third of the turns, the last third, all; CPU per turn and "
                "per generated token of each server, TTFT p50 (first delta event)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    max_new = args.tokens[1] + 1024
    context = 2 * (args.system_tokens + args.turns * 3 * (args.tokens[1] + 200) + max_new) \
        + 32768  # the fixtures own system prompts and tools
    incremental = args.stream_mode == "incremental"
    engine = start_mock(args.tokenizer, token_latency_ms=args.token_latency_ms,
                        extra=("--context-length", str(context),
                               *(("--incremental-streaming-output",) if incremental else ())))
    gw = start_gateway(args.tokenizer, engine.url, "--max-body-bytes", str(256 << 20),
                       "--default-max-tokens", str(max_new))
    script = Path(__file__).resolve().parent / "streaming_proxy.py"
    proxy = start_server("streaming proxy", [sys.executable, str(script), "--upstream",
                                             engine.url, "--port", "0",
                                             "--max-new-tokens", str(max_new),
                                             *(("--incremental",) if incremental else ())])
    results = []
    try:
        for door in args.doors:
            results.append(measure_door(args, door, gw, proxy))
            print_results(results[-1:], args)  # each door as soon as it is measured
            if args.json is not None:
                args.json.write_text(json.dumps(results, indent=2))
    finally:
        for proc in (proxy, gw, engine):
            proc.stop()
    if len(results) > 1:
        print_results(results, args)


if __name__ == "__main__":
    main()
