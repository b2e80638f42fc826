"""Turn-cost scaling: gateway CPU per turn along one long trajectory, next to a full re-render.

One session plays ``--turns`` turns (default 200: the history grows to ~28k tokens with
the default I=O=64) against ``tito serve`` + ``tito mock-engine``, one request at a time,
and the gateway's on-CPU time is read around every request
(``/proc/<pid>/task/*/schedstat``). The trajectory is played ``--repeat`` times (fresh
sessions); each sampled turn shows the median over the repeats and the turns around it.

The baseline is what a gateway that re-renders and re-tokenizes the whole history every
turn would spend on that alone: ``build_renderer("qwen3", dir).render_prompt(messages)``
timed in-process on the same messages. A second table splits the gateway's per-turn
work in-process (request JSON parse, validation, session plan = replay match + bridge,
engine payload encode) at the first and the last turn, so a growing term is visible.

    python benchmarks/turn_scaling.py
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from _load import SAMPLING
from _paths import QWEN3_DIR
from _processes import busy_cpu_s, cpu_ns, start_gateway, start_mock, start_passthrough
from _tables import fmt, median, print_table
from _workload import build_workload


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--turns", "-T", type=int, default=200, help="turns of the trajectory")
    p.add_argument("--input-tokens", "-I", type=int, default=64,
                   help="content tokens of the message appended every turn")
    p.add_argument("--output-tokens", "-O", type=int, default=64,
                   help="tokens generated per turn (stop id included)")
    p.add_argument("--append-role", choices=["tool", "user"], default="tool")
    p.add_argument("--repeat", type=int, default=3, help="trajectories played (medians)")
    p.add_argument("--window", type=int, default=2,
                   help="turns on each side of a sampled turn pooled into its median")
    p.add_argument("--baseline-reps", type=int, default=3,
                   help="timed full re-renders per sampled turn (the minimum is shown)")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def sample_points(turns: int) -> list[int]:
    points = [1, 2, 5, 10, 20, 50, 100, 150, 200, 300, 500, 1000]
    out = sorted({p for p in points if p <= turns} | {turns})
    return out


class Client:
    """A keep-alive HTTP/1.1 client with TCP_NODELAY (the gateway is the one measured)."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"content-type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=body, headers=headers)
        resp = self.conn.getresponse()
        return resp.status, resp.read()


def play(client: Client, gateway_pid: int, engine_pid: int, wl: Any, turns: int
         ) -> tuple[list[float], list[float], list[list[dict[str, Any]]], list[int]]:
    """One trajectory: gateway and engine CPU ms per turn, the messages sent, prompt sizes."""
    import orjson

    status, raw = client.request("POST", "/sessions")
    assert status == 200, raw
    sid = orjson.loads(raw)["session_id"]
    path = f"/sessions/{sid}/v1/chat/completions"
    messages = list(wl.first_messages[0])
    gateway_ms: list[float] = []
    engine_ms: list[float] = []
    sent: list[list[dict[str, Any]]] = []
    prompts: list[int] = []
    for t in range(turns):
        body = orjson.dumps({"messages": messages, "max_tokens": wl.max_tokens})
        g0, e0 = cpu_ns(gateway_pid), cpu_ns(engine_pid)
        status, raw = client.request("POST", path, body)
        g1, e1 = cpu_ns(gateway_pid), cpu_ns(engine_pid)
        if status != 200:
            raise SystemExit(f"turn {t}: HTTP {status}: {raw[:300]!r}")
        gateway_ms.append((g1 - g0) / 1e6)
        engine_ms.append((e1 - e0) / 1e6)
        data = orjson.loads(raw)
        sent.append(list(messages))
        prompts.append(data["usage"]["prompt_tokens"])
        messages += [data["choices"][0]["message"], wl.appended]
    client.request("DELETE", f"/sessions/{sid}")
    return gateway_ms, engine_ms, sent, prompts


def play_tokens(client: Client, proxy_pid: int, wl: Any, turns: int) -> list[float]:
    """The same trajectory as token requests through the pass-through proxy: its CPU ms/turn."""
    import orjson

    ids = list(wl.first_prompt_ids[0])
    sampling = {**SAMPLING, "max_new_tokens": wl.max_tokens}
    out: list[float] = []
    for t in range(turns):
        body = orjson.dumps({"input_ids": ids, "rid": f"scaling-{t}-{time.monotonic_ns()}",
                             "sampling_params": sampling, "return_logprob": True,
                             "logprob_start_len": -1, "stream": False})
        p0 = cpu_ns(proxy_pid)
        status, raw = client.request("POST", "/generate", body)
        out.append((cpu_ns(proxy_pid) - p0) / 1e6)
        if status != 200:
            raise SystemExit(f"pass-through turn {t}: HTTP {status}: {raw[:300]!r}")
        ids += orjson.loads(raw)["output_ids"] + wl.bridge_ids
    return out


def cpu_time(fn: Any, reps: int) -> float:
    """Minimum thread CPU milliseconds of ``fn()`` over ``reps`` calls."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time_ns()
        fn()
        best = min(best, (time.thread_time_ns() - t0) / 1e6)
    return best


def components(renderer: Any, wl: Any, messages: list[dict[str, Any]],
               reps: int = 20) -> dict[str, float]:
    """In-process CPU ms of the gateway's per-turn steps for a request with ``messages``."""
    import numpy as np
    import orjson

    from tito.engines.mock.directives import MockModel
    from tito.server.openai.convert import session_messages
    from tito.server.openai.models import validate_chat
    from tito.session.linear import LinearSession
    from tito.session.matchers import strict
    from tito.types.engine import GenerateResult, check_output
    from tito.types.messages import TurnRequest

    # the gateway encodes with the fast encoder once it is built (at startup)
    building = renderer.tokenizer.start_fast_encoder()
    if building is not None:
        building.join()
    # rebuild the session state the gateway holds before this request: every turn but
    # the last one committed (history = the request minus its appended message)
    model = MockModel(renderer)
    session = LinearSession("bench", renderer, strict)
    history = messages[:2]
    while len(history) < len(messages):
        plan = session.plan(TurnRequest(messages=list(history)))
        out = model.plan(plan.prompt_ids.tolist(), max_new_tokens=wl.max_tokens)
        result = GenerateResult(output_ids=out.output_ids, logprobs=out.logprobs,
                                finish_reason="stop")
        reply = renderer.parse(result.output_ids, "stop").to_message()
        output = check_output(result, renderer.tokenizer.vocab_size)
        session.commit(plan, result, output, reply)
        history = messages[: len(history) + 2]
    assert len(session.messages) == len(messages) - 1
    body = orjson.dumps({"messages": messages, "max_tokens": wl.max_tokens})
    data = orjson.loads(body)
    turn = TurnRequest(messages=session_messages(data))
    prompt = np.concatenate([session.snapshot.view(), np.asarray(wl.bridge_ids, np.int32)])

    def plan_only() -> None:
        session.release(session.plan(turn))

    previous = session.messages[-1]
    return {
        "request JSON parse": cpu_time(lambda: orjson.loads(body), reps),
        "request validation": cpu_time(lambda: validate_chat(  # as the gateway does:
            data, stored=list(session.messages)), reps),  # the stored prefix was checked
        "session plan (match + bridge)": cpu_time(plan_only, reps),
        "  of which bridge": cpu_time(lambda: renderer.bridge(
            previous, renderer.primary_stop_id, messages[len(session.messages):]), reps),
        "engine payload encode": cpu_time(lambda: orjson.dumps(
            {"input_ids": prompt}, option=orjson.OPT_SERIALIZE_NUMPY), reps),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.turns < 2:
        raise SystemExit("--turns must be at least 2")
    if not args.tokenizer.is_dir():
        raise SystemExit(f"tokenizer folder not found: {args.tokenizer}")
    from tito.render import build_renderer

    started = time.perf_counter()
    wl = build_workload(args.tokenizer, sessions=1, turns=args.turns,
                        input_tokens=args.input_tokens, output_tokens=args.output_tokens,
                        append_role=args.append_role)
    renderer = build_renderer("qwen3", args.tokenizer)
    mock = start_mock(args.tokenizer)
    try:
        gateway = start_gateway(args.tokenizer, mock.url)
        try:
            client = Client(gateway.url)
            play(client, gateway.pid, mock.pid, wl, min(5, args.turns))  # warm-up
            busy0, own0 = busy_cpu_s(), time.process_time()
            cpu0, t0 = cpu_ns(gateway.pid) + cpu_ns(mock.pid), time.perf_counter()
            runs = [play(client, gateway.pid, mock.pid, wl, args.turns)
                    for _ in range(max(1, args.repeat))]
            ours = (cpu_ns(gateway.pid) + cpu_ns(mock.pid) - cpu0) / 1e9 + \
                time.process_time() - own0
            other = max(0.0, busy_cpu_s() - busy0 - ours) / (time.perf_counter() - t0)
        finally:
            gateway.stop()
        proxy = start_passthrough(mock.url)
        try:
            proxy_client = Client(proxy.url)
            play_tokens(proxy_client, proxy.pid, wl, min(5, args.turns))  # warm-up
            proxy_runs = [play_tokens(proxy_client, proxy.pid, wl, args.turns)
                          for _ in range(max(1, args.repeat))]
        finally:
            proxy.stop()
    finally:
        mock.stop()
    _, _, sent, prompts = runs[0]

    def pooled(series_index: int, turn: int) -> float:
        lo, hi = max(1, turn - args.window), min(args.turns, turn + args.window)
        series = proxy_runs if series_index < 0 else [r[series_index] for r in runs]
        return median([r[k - 1] for r in series for k in range(lo, hi + 1)])

    points = sample_points(args.turns)
    rows = []
    figures = []
    base_gw = base_full = base_px = None
    for turn in points:
        gw = pooled(0, turn)
        eng = pooled(1, turn)
        px = pooled(-1, turn)
        msgs = sent[turn - 1]
        full = cpu_time(lambda m=msgs: renderer.render_prompt(m), args.baseline_reps)
        base_gw = base_gw or gw
        base_full = base_full or full
        base_px = base_px or px
        rows.append([turn, f"{prompts[turn - 1]:,}", len(msgs), fmt(gw, 3),
                     f"{gw / base_gw:.2f}x", fmt(px, 3), f"{px / base_px:.2f}x", fmt(full, 2),
                     f"{full / base_full:.1f}x", fmt(eng, 3)])
        figures.append({"turn": turn, "prompt_tokens": prompts[turn - 1], "messages": len(msgs),
                        "gateway_cpu_ms": gw, "passthrough_cpu_ms": px,
                        "full_rerender_ms": full, "engine_cpu_ms": eng})
    print_table(
        f"turn scaling: one trajectory of {args.turns} turns, I={wl.content_tokens} "
        f"O={wl.output_tokens} append={wl.append_role} ({args.repeat} runs)",
        ["turn", "prompt tokens", "messages", "tito CPU/turn (ms)", "vs turn 1",
         "pass-through CPU/turn (ms)", "vs turn 1", "full re-render+tokenize (ms)",
         "vs turn 1", "engine CPU/turn (ms)"], rows,
        caption=(f"tito: gateway process CPU for the whole request (median over {args.repeat} "
                 f"runs x turns +-{args.window}); pass-through: the proxy's CPU for the same "
                 "prompts as token requests; full re-render: render_prompt(all messages) "
                 "in-process, the cost a re-rendering gateway adds on top of HTTP/JSON. "
                 f"Other load on the machine during the gateway runs: {other:.2f} cores."))
    last = figures[-1]
    ratio = last["gateway_cpu_ms"] / figures[0]["gateway_cpu_ms"]
    print(f"target: CPU per turn at turn {last['turn']} <= 1.5x turn 1: {ratio:.2f}x "
          f"({'met' if ratio <= 1.5 else 'NOT met'})")

    first_c = components(renderer, wl, sent[min(1, len(sent) - 1)])
    last_c = components(renderer, wl, sent[-1])
    split_turn = min(2, len(sent))
    comp_rows = [[name, fmt(first_c[name], 3), fmt(last_c[name], 3)] for name in first_c]
    print_table("where a turn's work grows (in-process CPU ms, min of 20)",
                ["step", f"turn {split_turn}", f"turn {len(sent)}"], comp_rows)
    print(f"total benchmark time {time.perf_counter() - started:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"points": figures, "other_load_cores": other,
                                         "components": {
            f"turn_{split_turn}": first_c, f"turn_{len(sent)}": last_c}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
