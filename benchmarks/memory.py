"""Memory: gateway RSS per stored token, samples payload size, ``GET /sessions/<id>`` size.

Through the real server: ``tito serve`` + ``tito mock-engine``; a load generator in its
own process plays ``--sessions`` sessions (default 1,000) of ``--turns`` turns (default 8
turns of I=O=512 tokens: ~8.3k tokens per session), ``--concurrency`` at a time, and
leaves them alive. RSS growth of the gateway process (``VmRSS`` after - before) divided by
the stored tokens (sum of the sessions' ``num_tokens``) is the figure of record. The
sessions first fill the memory the startup freed (already counted before), so a second
run of as many sessions gives the marginal bytes per token as well (``--no-marginal``
skips it). An in-process replay of the same sessions (``LinearSession`` + the mock's model, no HTTP)
splits the bytes by owner (token ids, logprobs, snapshot, messages, the rest).

Then, on the server: the samples payload of a few sessions against the raw bytes of
their tensors (wire dtypes: tokens int64, loss mask uint8, logprobs float32), and the
body size of ``GET /sessions/<id>`` (default page, ``include_ids``, ``include_messages``,
``include_requests``)
for one of these sessions and for one long session (``--long-turns`` turns of I=O=64).

    python benchmarks/memory.py
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from _load import run_phase
from _paths import QWEN3_DIR
from _processes import http_json, peak_rss_bytes, rss_bytes, start_gateway, start_mock
from _tables import fmt, print_table
from _workload import build_workload


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sessions", "-S", type=int, default=1000, help="sessions kept alive")
    p.add_argument("--turns", "-T", type=int, default=8, help="turns per session")
    p.add_argument("--input-tokens", "-I", type=int, default=512,
                   help="content tokens of the message appended every turn")
    p.add_argument("--output-tokens", "-O", type=int, default=512,
                   help="tokens generated per turn")
    p.add_argument("--concurrency", type=int, default=32, help="sessions running at once")
    p.add_argument("--samples", type=int, default=5, help="sessions whose samples are sized")
    p.add_argument("--inprocess-sessions", type=int, default=100,
                   help="sessions replayed in-process for the per-owner breakdown")
    p.add_argument("--long-turns", type=int, default=200,
                   help="turns of the long session whose GET /sessions/<id> pages are sized "
                        "(I=O=64; 0: skip)")
    p.add_argument("--no-marginal", dest="marginal", action="store_false",
                   help="skip the second run of as many sessions (the marginal bytes per "
                        "token, past the free memory the startup left)")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def deep_size(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of a JSON-like Python object graph (dicts, lists, str, numbers)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple):
        size += sum(deep_size(v, seen) for v in obj)
    return size


def in_process_breakdown(tokenizer: Path, wl: Any, sessions: int) -> dict[str, float]:
    """Bytes per stored token by owner, for ``sessions`` replayed without HTTP."""
    import numpy as np
    import orjson

    from tito.engines.mock.directives import MockModel
    from tito.render import build_renderer
    from tito.session.linear import LinearSession
    from tito.session.matchers import strict
    from tito.types.engine import GenerateResult, check_output
    from tito.types.messages import TurnRequest

    renderer = build_renderer("qwen3", tokenizer)
    model = MockModel(renderer)
    appended = orjson.dumps(wl.appended)
    # warm every cache (template compile, tokenizer, mock render cache) before measuring
    warm = LinearSession("warm", renderer, strict)
    plan = warm.plan(TurnRequest(messages=orjson.loads(orjson.dumps(wl.first_messages[0]))))
    out = model.plan(plan.prompt_ids.tolist(), max_new_tokens=wl.max_tokens)
    renderer.parse(out.output_ids, "stop")
    warm.release(plan)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept: list[LinearSession] = []
    for i in range(sessions):
        session = LinearSession(f"s{i}", renderer, strict)
        history = orjson.dumps(wl.first_messages[i % len(wl.first_messages)])[1:-1]
        for _ in range(wl.turns):
            # every request is a fresh JSON parse, as on the server: no shared strings
            messages = orjson.loads(b"[" + history + b"]")
            plan = session.plan(TurnRequest(messages=messages))
            out = model.plan(plan.prompt_ids.tolist(), max_new_tokens=wl.max_tokens)
            result = GenerateResult(output_ids=out.output_ids, logprobs=out.logprobs,
                                    finish_reason="stop")
            reply = renderer.parse(result.output_ids, "stop").to_message()
            output = check_output(result, renderer.tokenizer.vocab_size)
            session.commit(plan, result, output, reply)
            history += b"," + orjson.dumps(reply) + b"," + appended
        kept.append(session)
    gc.collect()
    total = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    tokens = sum(s.num_tokens for s in kept)
    output_tokens = sum(len(r.output_ids) for s in kept for r in s.records)
    snapshot = sum(s.snapshot.nbytes for s in kept)
    # a record's ids are views of its session's snapshot (qwen3 has no trailing trim);
    # only ids that are not are stored twice
    ids = sum(a.nbytes for s in kept for r in s.records for a in (r.bridge_ids, r.output_ids)
              if a.base is not s.snapshot.storage)
    logprobs = sum(r.logprobs.nbytes for s in kept for r in s.records)
    messages = sum(deep_size(s.messages) for s in kept)
    arrays = 3 * sum(len(s.records) for s in kept)
    array_headers = arrays * sys.getsizeof(np.zeros(0, np.int32))
    rest = total - snapshot - ids - logprobs - messages - array_headers
    return {
        "tokens": tokens,
        "output_tokens": output_tokens,
        "total": total / tokens,
        "snapshot (IdBuffer, int32, with growth slack; the records view it)":
            snapshot / tokens,
        "record ids outside the snapshot (int32)": ids / tokens,
        "record logprobs (float32, output only)": logprobs / tokens,
        "numpy array headers (3 per record)": array_headers / tokens,
        "stored messages (dicts + text)": messages / tokens,
        "records, sessions, rest": rest / tokens,
    }


def sample_sizes(gateway_url: str, sids: list[str]) -> dict[str, float]:
    import urllib.request
    import zlib

    import safetensors.numpy

    from tito.samples import META_KEY, decode_samples

    payload = raw = meta = response = metadata = meta_z = lean = 0
    seconds = 0.0
    for sid in sids:
        lean_req = urllib.request.Request(
            f"{gateway_url}/sessions/{sid}/samples", data=b'{"include_response": false}',
            method="POST", headers={"content-type": "application/json"})
        with urllib.request.urlopen(lean_req, timeout=120) as resp:
            lean += len(resp.read())
        req = urllib.request.Request(f"{gateway_url}/sessions/{sid}/samples", data=b"{}",
                                     method="POST",
                                     headers={"content-type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=120) as resp:
            body = resp.read()
        seconds += time.perf_counter() - t0
        decoded = decode_samples(body)
        payload += len(body)
        for s in decoded.samples:
            raw += s.tokens.nbytes
            raw += s.loss_mask.nbytes if s.loss_mask is not None else 0
            raw += s.rollout_log_probs.nbytes if s.rollout_log_probs is not None else 0
            response += len(s.response.encode())
            metadata += len(json.dumps(s.metadata, default=str).encode())
        meta_bytes = safetensors.numpy.load(body)[META_KEY].tobytes()
        meta += len(meta_bytes)
        meta_z += len(zlib.compress(meta_bytes, 6))
    n = max(1, len(sids))
    return {"payload": payload / n, "raw": raw / n, "meta": meta / n, "response": response / n,
            "metadata": metadata / n, "meta_zlib": meta_z / n, "lean": lean / n,
            "ms": seconds * 1000 / n}


def page_sizes(gateway_url: str, sid: str) -> list[tuple[str, int, float]]:
    import urllib.request

    out = []
    for query in ("", "?include_ids=true", "?include_messages=true",
                  "?include_ids=true&include_messages=true&limit=1000",
                  "?include_requests=true&limit=1000"):
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"{gateway_url}/sessions/{sid}{query}", timeout=120) as r:
            body = r.read()
        out.append((query or "(default page)", len(body), (time.perf_counter() - t0) * 1000))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.tokenizer.is_dir():
        raise SystemExit(f"tokenizer folder not found: {args.tokenizer}")
    started = time.perf_counter()
    wl = build_workload(args.tokenizer, sessions=args.sessions, turns=args.turns,
                        input_tokens=args.input_tokens, output_tokens=args.output_tokens)
    wl.concurrency = args.concurrency
    wl.keep_sessions = True
    for note in wl.notes:
        print(f"note: {note}", file=sys.stderr)
    figures: dict[str, Any] = {}
    mock = start_mock(args.tokenizer)
    try:
        gateway = start_gateway(args.tokenizer, mock.url)
        try:
            # warm-up: one short session, created and deleted
            warm = build_workload(args.tokenizer, sessions=2, turns=2,
                                  input_tokens=args.input_tokens,
                                  output_tokens=args.output_tokens)
            run_phase("gateway", gateway.url, warm, {"gateway": gateway.pid})
            rss0 = rss_bytes(gateway.pid)
            phase = run_phase("gateway", gateway.url, wl, {"gateway": gateway.pid})
            if phase.load.errors:
                raise SystemExit(f"load errors: {phase.load.errors[:3]}")
            rss1 = rss_bytes(gateway.pid)
            sids = phase.load.session_ids
            tokens = sum(http_json("GET", f"{gateway.url}/sessions/{sid}?limit=1")
                         ["metadata"]["num_tokens"] for sid in sids)
            figures["server"] = {
                "sessions": len(sids), "turns": wl.turns, "tokens": tokens,
                "rss_before_mb": rss0 / 2**20, "rss_after_mb": rss1 / 2**20,
                "peak_rss_mb": peak_rss_bytes(gateway.pid) / 2**20,
                "bytes_per_token": (rss1 - rss0) / tokens, "run_s": phase.load.wall_s,
            }
            if args.marginal:  # as many sessions again: what each extra token costs
                again = run_phase("gateway", gateway.url, wl, {"gateway": gateway.pid})
                if again.load.errors:
                    raise SystemExit(f"load errors: {again.load.errors[:3]}")
                rss2 = rss_bytes(gateway.pid)
                more = sum(http_json("GET", f"{gateway.url}/sessions/{sid}?limit=1")
                           ["metadata"]["num_tokens"] for sid in again.load.session_ids)
                figures["server"].update(rss_second_mb=rss2 / 2**20,
                                         marginal_bytes_per_token=(rss2 - rss1) / more)
            figures["samples"] = sample_sizes(gateway.url, sids[: args.samples])
            figures["pages"] = {"session": page_sizes(gateway.url, sids[0])}
            if args.long_turns:
                long_wl = build_workload(args.tokenizer, sessions=1, turns=args.long_turns,
                                         input_tokens=64, output_tokens=64)
                long_wl.keep_sessions = True
                long_phase = run_phase("gateway", gateway.url, long_wl, {"gateway": gateway.pid})
                long_sid = long_phase.load.session_ids[0]
                figures["pages"]["long"] = page_sizes(gateway.url, long_sid)
                figures["long_tokens"] = long_phase.load.prompt_tokens_last
        finally:
            gateway.stop()
    finally:
        mock.stop()
    breakdown = in_process_breakdown(args.tokenizer, wl, args.inprocess_sessions)
    figures["in_process"] = breakdown

    srv = figures["server"]
    print_table(
        f"gateway RSS per stored token: {srv['sessions']:,} sessions x {wl.turns} turns "
        f"(I={wl.content_tokens} O={wl.output_tokens}), through tito serve",
        ["", "value"],
        [["stored tokens", f"{srv['tokens']:,}"],
         ["tokens per session", f"{srv['tokens'] / max(1, srv['sessions']):,.0f}"],
         ["RSS before / after (MiB)", f"{srv['rss_before_mb']:.1f} / {srv['rss_after_mb']:.1f}"],
         ["peak RSS (MiB)", f"{srv['peak_rss_mb']:.1f}"],
         ["RSS growth per stored token (bytes)", fmt(srv["bytes_per_token"], 1)],
         *([["RSS after as many sessions again (MiB)", f"{srv['rss_second_mb']:.1f}"],
            ["marginal bytes per stored token (the second run)",
             fmt(srv["marginal_bytes_per_token"], 1)]]
           if "marginal_bytes_per_token" in srv else []),
         ["load run (s)", fmt(srv["run_s"], 1)]],
        caption="target: <= 16 bytes per stored token; the first run fills the holes the "
                "startup left (already in the RSS before), the second shows what each "
                "extra token costs")
    rows = [[k, fmt(v, 2)] for k, v in breakdown.items() if k not in ("tokens", "output_tokens")]
    print_table(
        f"bytes per stored token by owner: {args.inprocess_sessions} sessions replayed "
        f"in-process (tracemalloc; {breakdown['output_tokens'] / breakdown['tokens']:.0%} "
        "of the tokens are generated)", ["owner", "bytes/token"], rows)
    smp = figures["samples"]
    print_table(
        f"samples payload (mean of {min(args.samples, srv['sessions'])} sessions, "
        f"{srv['tokens'] / max(1, srv['sessions']):,.0f} tokens each)",
        ["", "bytes", "vs raw tensors"],
        [["payload (safetensors container)", f"{smp['payload']:,.0f}",
          f"{smp['payload'] / smp['raw']:.3f}x"],
         ["raw tensors (tokens i64 + mask u8 + logprobs f32)", f"{smp['raw']:,.0f}", "1.000x"],
         ["_samples_meta JSON", f"{smp['meta']:,.0f}", f"{smp['meta'] / smp['raw']:.3f}x"],
         ["  of which response text", f"{smp['response']:,.0f}",
          f"{smp['response'] / smp['raw']:.3f}x"],
         ["  of which sample metadata", f"{smp['metadata']:,.0f}",
          f"{smp['metadata'] / smp['raw']:.3f}x"],
         ['payload with {"include_response": false}', f"{smp['lean']:,.0f}",
          f"{smp['lean'] / smp['raw']:.3f}x"],
         ["(estimate) with zlib-compressed meta (mock text: optimistic)",
          f"{smp['payload'] - smp['meta'] + smp['meta_zlib']:,.0f}",
          f"{(smp['payload'] - smp['meta'] + smp['meta_zlib']) / smp['raw']:.3f}x"],
         ["collect latency (ms)", fmt(smp["ms"], 1), ""]],
        caption="target: payload <= 1.1x raw tensor bytes")
    page_rows = []
    per_session = srv["tokens"] / max(1, srv["sessions"])
    for label, key in ((f"{per_session / 1000:.1f}k-token session", "session"),
                       ("long session", "long")):
        for query, size, ms in figures["pages"].get(key, []):
            page_rows.append([label, query, f"{size:,}", fmt(ms, 1)])
    long_note = (f"long session: {args.long_turns} turns, {figures.get('long_tokens', 0):,} "
                 "prompt tokens at its last turn" if args.long_turns else "")
    print_table("GET /sessions/<id> body size", ["session", "query", "bytes", "ms"], page_rows,
                caption=long_note or None)
    print(f"total benchmark time {time.perf_counter() - started:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
