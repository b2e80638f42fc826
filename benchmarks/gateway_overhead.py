"""Gateway overhead: turns/s, latency and CPU per turn of ``tito serve`` next to two baselines.

Starts ``tito mock-engine`` (zero or fixed latency), ``tito serve`` (Qwen3 tokenizer,
family qwen3) and the pass-through proxy (``benchmarks/passthrough_proxy.py``), then runs
the same workload three times from a load generator in its own process (aiohttp, own
event loop): S sessions in parallel, T sequential turns each, every turn appending one
message of I tokens (``--append-role``) and generating O tokens (the mock's ``SAY``
directive, stop id included).

- **direct**: the load generator calls the mock's ``/generate`` with the token ids the
  gateway would send (prompt growing by bridge + O per turn, precomputed: no tokenization);
- **pass-through**: the same token requests through a minimal proxy on the gateway's HTTP
  stack (Starlette + aiohttp client + orjson; no tokenization, no state);
- **tito**: OpenAI chat requests (full history each turn, as agents send them) to
  ``/sessions/<id>/v1/chat/completions``.

CPU per turn is the on-CPU time of each process over the timed part divided by the
turns (``/proc/<pid>/task/*/schedstat``, ns resolution); peak RSS is ``VmHWM``.

    python benchmarks/gateway_overhead.py                      # S=32 T=20 I=O=64
    python benchmarks/gateway_overhead.py --sessions 256       # many sessions
    python benchmarks/gateway_overhead.py --turns 200          # long trajectories
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _load import PhaseResult, run_phase
from _paths import QWEN3_DIR
from _processes import Proc, http_json, rss_bytes, start_gateway, start_mock, start_passthrough
from _profiling import PySpy, by_package, package_samples, top_frames
from _tables import fmt, median, percentile, print_table
from _workload import add_workload_args, build_workload

MODES = ("direct", "passthrough", "gateway")
LABELS = {"direct": "direct engine", "passthrough": "pass-through", "gateway": "tito gateway"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_workload_args(p)
    p.add_argument("--append-role", choices=["tool", "user"], default="tool",
                   help="role of the message appended every turn")
    p.add_argument("--latency-ms", type=float, default=0.0,
                   help="mock engine latency per request (0: answer at once)")
    p.add_argument("--token-latency-ms", type=float, default=0.0,
                   help="mock engine latency per generated token")
    p.add_argument("--stagger-ms", type=float, default=None,
                   help="spread the session starts over this many ms, so that requests do not "
                        "arrive in synchronized bursts (default: --latency-ms)")
    p.add_argument("--r3-bytes-per-token", type=int, default=0,
                   help="routing replay: int32 routing bytes per token (a multiple of 4; the "
                        "reference benchmark's default is 1000); the mock returns real base64 "
                        "rows, the gateway runs with --routing-replay and the token "
                        "baselines ask for the same rows; 0: off")
    p.add_argument("--r3-mode", choices=["incremental", "full"], default="incremental",
                   help="incremental: rows after the stored prefix (--pause-generation-mode "
                        "in_place); full: every row every turn (retract)")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of each mode, interleaved (direct, pass-through, tito, direct, "
                        "...); the table shows the median of each figure")
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated subset of direct,passthrough,gateway")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR, help="Qwen3 tokenizer folder")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--py-spy", type=Path, default=None, metavar="FILE",
                   help="profile the gateway during its runs with py-spy (--gil; collapsed "
                        "stacks to FILE) and print its top frames; with the pass-through mode "
                        "also the proxy (to FILE.proxy), and the GIL-holding time per turn "
                        "of both by package; inflates the CPU figures")
    p.add_argument("--gateway-arg", action="append", default=[], metavar="FLAG",
                   help="extra `tito serve` flag (repeatable; e.g. --gateway-arg=--journal "
                        "--gateway-arg=/tmp/j to measure the journal's cost)")
    p.add_argument("--no-check", action="store_true",
                   help="skip the check that the baselines replay the gateway's exact ids")
    return p.parse_args(argv)


def check_equivalence(mock: Proc, gateway: Proc, wl: Any) -> str:
    """The token baselines must send the very ids the gateway sends (two turns, session 0)."""
    import orjson

    http_json("DELETE", mock.url + "/mock/requests")
    sid = http_json("POST", gateway.url + "/sessions")["session_id"]
    messages = list(wl.first_messages[0])
    for _ in range(2):
        body = orjson.dumps({"messages": messages, "max_tokens": wl.max_tokens})
        reply = http_json("POST", f"{gateway.url}/sessions/{sid}/v1/chat/completions", body)
        messages += [reply["choices"][0]["message"], wl.appended]
    http_json("DELETE", f"{gateway.url}/sessions/{sid}")
    log = http_json("GET", mock.url + "/mock/requests")
    http_json("DELETE", mock.url + "/mock/requests")
    first, second = log[-2], log[-1]
    expected = wl.first_prompt_ids[0] + first["output_ids"] + wl.bridge_ids
    if first["input_ids"] != wl.first_prompt_ids[0] or second["input_ids"] != expected:
        raise SystemExit("the token baselines would not replay the gateway's ids; "
                         "the comparison would be unfair")
    if len(first["output_ids"]) != wl.output_tokens:
        raise SystemExit(f"the mock generated {len(first['output_ids'])} tokens, "
                         f"not {wl.output_tokens}")
    return "ok"


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every numeric figure over the repeats (errors: all of them)."""
    out: dict[str, Any] = {"repeats": len(runs)}
    for key, value in runs[0].items():
        if key == "errors":
            out[key] = [e for r in runs for e in r[key]]
        elif isinstance(value, int | float) and not isinstance(value, bool):
            vals = [r[key] for r in runs if r.get(key) is not None]
            out[key] = median(vals)
            if key in ("server_cpu_ms_per_turn", "turns_per_s", "p50_ms"):
                out[key + "_all"] = vals
        else:
            out[key] = value
    return out


def summarize(mode: str, phase: PhaseResult, turns: int) -> dict[str, Any]:
    lat = phase.load.latencies_ms
    server = {"passthrough": "proxy", "gateway": "gateway"}.get(mode)
    out = {
        "turns": len(lat),
        "wall_s": phase.load.wall_s,
        "turns_per_s": len(lat) / phase.load.wall_s if phase.load.wall_s else float("nan"),
        "p50_ms": percentile(lat, 50),
        "p95_ms": percentile(lat, 95),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat) if lat else float("nan"),
        "engine_cpu_ms_per_turn": phase.server_cpu_s["engine"] * 1000 / max(1, len(lat)),
        "loadgen_cpu_ms_per_turn": phase.load.loadgen_cpu_s * 1000 / max(1, len(lat)),
        "server_cpu_ms_per_turn": (phase.server_cpu_s[server] * 1000 / max(1, len(lat))
                                   if server else None),
        "server_peak_rss_mb": phase.peak_rss[server] / 2**20 if server else None,
        "prompt_growth_per_turn": phase.load.prompt_growth,
        "output_tokens_per_turn": phase.load.output_tokens / max(1, len(lat)),
        "last_prompt_tokens": phase.load.prompt_tokens_last,
        "other_load_cores": phase.other_cores,
        "errors": phase.load.errors[:5],
    }
    if len(lat) != turns:
        out["errors"].append(f"{len(lat)} turns completed of {turns}")
    return out


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0 or a != a or b != b:
        return "-"
    return f"{a / b:.2f}x"


def report(args: argparse.Namespace, wl: Any, res: dict[str, dict[str, Any]]) -> None:
    d, p, g = (res.get(m, {}) for m in MODES)

    def row(label: str, key: str, digits: int = 2, ratios: bool = True) -> list[str]:
        vals = [r.get(key) for r in (d, p, g)]
        return [label, *(fmt(v, digits) for v in vals),
                ratio(g.get(key), p.get(key)) if ratios else "-",
                ratio(g.get(key), d.get(key)) if ratios else "-"]

    rows = [
        row("turns/s", "turns_per_s", 0),
        row("latency p50 (ms)", "p50_ms"),
        row("latency p95 (ms)", "p95_ms"),
        row("latency p99 (ms)", "p99_ms"),
        row("latency max (ms)", "max_ms"),
        row("server CPU per turn (ms)", "server_cpu_ms_per_turn", 3),
        row("engine CPU per turn (ms)", "engine_cpu_ms_per_turn", 3, ratios=False),
        row("load generator CPU per turn (ms)", "loadgen_cpu_ms_per_turn", 3, ratios=False),
        row("server peak RSS (MiB)", "server_peak_rss_mb", 1),
        row("stored bytes per token", "stored_bytes_per_token", 1, ratios=False),
        row("  of which routing rows", "stored_routing_bytes_per_token", 1, ratios=False),
        row("prompt growth per turn (tokens)", "prompt_growth_per_turn", 1, ratios=False),
        row("output tokens per turn", "output_tokens_per_turn", 1, ratios=False),
        row("other load on the machine (cores)", "other_load_cores", 2, ratios=False),
    ]
    title = (f"gateway overhead: S={wl.sessions} T={wl.turns} I={wl.content_tokens} "
             f"O={wl.output_tokens} append={wl.append_role} "
             + (f"routing={args.r3_bytes_per_token} B/token {args.r3_mode} "
                if args.r3_bytes_per_token else "")
             + f"engine latency={args.latency_ms:g} ms (+{args.token_latency_ms:g} ms/token)"
             + (f" stagger={wl.stagger_s * 1000:g} ms" if wl.stagger_s else ""))
    caption = (f"median of {args.repeat} interleaved run(s) per mode. ratios: tito / baseline. "
               "server = the proxy or the gateway process; CPU from schedstat over the timed "
               "run; RSS peak = VmHWM; other load = busy CPU outside the benchmark's processes.")
    if g.get("server_cpu_ms_per_turn_all"):
        caption += ("\ntito CPU/turn per run (ms): "
                    + ", ".join(f"{v:.3f}" for v in g["server_cpu_ms_per_turn_all"]))
    if p.get("server_cpu_ms_per_turn_all"):
        caption += ("\npass-through CPU/turn per run (ms): "
                    + ", ".join(f"{v:.3f}" for v in p["server_cpu_ms_per_turn_all"]))
    paired = paired_cpu_ratios(p, g)
    if paired:
        caption += ("\ntito/pass-through CPU per turn, run by run (each gateway run over the "
                    "pass-through run just before it): "
                    + ", ".join(f"{v:.2f}" for v in paired)
                    + f"; median {median(paired):.2f}x")
    print_table(title, ["", "direct engine", "pass-through", "tito gateway", "tito/pass-through",
                        "tito/direct"], rows, caption)
    if g and d and p:
        added = g["p50_ms"] - d["p50_ms"]
        thr = g["turns_per_s"] / p["turns_per_s"]
        targets = [
            ["gateway CPU per turn <= 1.0 ms", fmt(g["server_cpu_ms_per_turn"], 3) + " ms",
             _ok(g["server_cpu_ms_per_turn"] <= 1.0)],
            ["turns/s >= 0.5x pass-through", f"{thr:.2f}x", _ok(thr >= 0.5)],
            ["added p50 over direct <= 2 ms", fmt(added) + " ms", _ok(added <= 2.0)],
        ]
        print_table("targets: gateway overhead", ["target", "measured", "met"], targets)
    if g.get("server_cpu_ms_per_turn") and p.get("server_cpu_ms_per_turn") and \
            not args.r3_bytes_per_token:
        cpu = g["server_cpu_ms_per_turn"] / p["server_cpu_ms_per_turn"]
        print_table("target: gateway CPU per turn <= 1.5x pass-through (one invocation is one "
                    "sample of a noisy figure: docs/performance.md gives the spread)",
                    ["target", "measured", "met"],
                    [["gateway CPU per turn <= 1.5x pass-through", f"{cpu:.2f}x",
                      _ok(cpu <= 1.5)]])
    for mode in MODES:
        for err in res.get(mode, {}).get("errors", []):
            print(f"ERROR {mode}: {err}", file=sys.stderr)


def paired_cpu_ratios(p: dict[str, Any], g: dict[str, Any]) -> list[float]:
    """Gateway CPU per turn over the pass-through's, run by run: the runs alternate, so each
    pair shared the machine's state of that moment (its speed drifts by tens of percent
    over minutes on a small VM), which the ratio of the two medians does not cancel."""
    pairs = zip(p.get("server_cpu_ms_per_turn_all") or [],
                g.get("server_cpu_ms_per_turn_all") or [], strict=False)
    return [gv / pv for pv, gv in pairs if pv]


def _ok(flag: bool) -> str:
    return "yes" if flag else "NO"


def check_args(args: argparse.Namespace) -> list[str]:
    """The modes to run; refuses unknown modes and a missing tokenizer, notes --r3."""
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := set(modes) - set(MODES):
        raise SystemExit(f"unknown modes: {sorted(unknown)}")
    if not args.tokenizer.is_dir():
        raise SystemExit(f"tokenizer folder not found: {args.tokenizer}")
    if args.r3_bytes_per_token % 4 or args.r3_bytes_per_token < 0:
        raise SystemExit("--r3-bytes-per-token must be a non-negative multiple of 4")
    return modes


def routing_shape(bytes_per_token: int) -> tuple[int, int]:
    """(layers, top_k) with layers * top_k * 4 == bytes_per_token (top_k 8, 4, 2 or 1)."""
    values = bytes_per_token // 4
    top_k = next(k for k in (8, 4, 2, 1) if values % k == 0)
    return values // top_k, top_k


def make_workload(args: argparse.Namespace) -> Any:
    wl = build_workload(args.tokenizer, sessions=args.sessions, turns=args.turns,
                        input_tokens=args.input_tokens, output_tokens=args.output_tokens,
                        append_role=args.append_role)
    wl.stagger_s = (args.latency_ms if args.stagger_ms is None else args.stagger_ms) / 1000
    wl.routing = args.r3_mode if args.r3_bytes_per_token else None
    for note in wl.notes:
        print(f"note: {note}", file=sys.stderr)
    return wl


@dataclass
class Servers:
    """The processes a run talks to: the mock engine, and the gateway and proxy if needed."""

    mock: Proc
    gateway: Proc | None = None
    proxy: Proc | None = None

    def target(self, mode: str) -> tuple[str, dict[str, int]]:
        """The URL the load generator calls for ``mode`` and the pids whose CPU is measured."""
        watch = {"engine": self.mock.pid}
        if mode == "passthrough":
            assert self.proxy is not None
            watch["proxy"] = self.proxy.pid
            return self.proxy.url, watch
        if mode == "gateway":
            assert self.gateway is not None
            watch["gateway"] = self.gateway.pid
            return self.gateway.url, watch
        return self.mock.url, watch


def start_servers(args: argparse.Namespace, modes: list[str], procs: list[Proc]) -> Servers:
    """Start what ``modes`` need; every started process is added to ``procs`` at once."""
    mock_extra: tuple[str, ...] = ()
    gateway_extra = list(args.gateway_arg)
    if args.r3_bytes_per_token:
        layers, top_k = routing_shape(args.r3_bytes_per_token)
        mock_extra = ("--enable-return-routed-experts", "--num-layers", str(layers),
                      "--topk", str(top_k), "--num-experts", "64")
        gateway_extra += ["--routing-replay", "--routing-layers", str(layers),
                          "--pause-generation-mode",
                          "in_place" if args.r3_mode == "incremental" else "retract"]
    mock = start_mock(args.tokenizer, latency_ms=args.latency_ms,
                      token_latency_ms=args.token_latency_ms, extra=mock_extra)
    procs.append(mock)
    servers = Servers(mock)
    if "gateway" in modes or not args.no_check:
        servers.gateway = start_gateway(args.tokenizer, mock.url, *gateway_extra)
        procs.append(servers.gateway)
    if "passthrough" in modes:
        servers.proxy = start_passthrough(mock.url)
        procs.append(servers.proxy)
    return servers


def proxy_profile_path(path: Path) -> Path:
    return path.with_name(path.name + ".proxy")


def start_profilers(args: argparse.Namespace, modes: list[str], servers: Servers
                    ) -> list[PySpy]:
    if args.py_spy is None or servers.gateway is None or "gateway" not in modes:
        return []
    spies = [PySpy(servers.gateway.pid, args.py_spy)]
    if servers.proxy is not None and "passthrough" in modes:
        spies.append(PySpy(servers.proxy.pid, proxy_profile_path(args.py_spy)))
    return spies


def run_modes(args: argparse.Namespace, modes: list[str], wl: Any,
              servers: Servers) -> dict[str, dict[str, Any]]:
    """The repeats of every mode, interleaved; the combined figures of each mode."""
    if servers.gateway is not None and not args.no_check:
        check_equivalence(servers.mock, servers.gateway, wl)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    spies = start_profilers(args, modes, servers)
    for _ in range(max(1, args.repeat)):
        for mode in (m for m in MODES if m in modes):
            url, watch = servers.target(mode)
            wl.keep_sessions = mode == "gateway"  # read their stored size, then delete
            phase = run_phase(mode, url, wl, watch)
            runs[mode].append(summarize(mode, phase, wl.sessions * wl.turns))
            if mode == "gateway":
                runs[mode][-1].update(stored_sizes(url, phase.load.session_ids))
    for spy in spies:
        spy.stop()
    results = {mode: combine(r) for mode, r in runs.items()}
    if servers.gateway is not None:
        results.setdefault("gateway", {})["rss_after_mb"] = rss_bytes(servers.gateway.pid) / 2**20
    return results


def stored_sizes(url: str, session_ids: list[str]) -> dict[str, float]:
    """Bytes the gateway stores per token for the sessions of a run (from ``/metrics``:
    token ids, logprobs and routing rows of the live sessions), then delete them."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith("tito_stored_")}
    for sid in session_ids:
        http_json("DELETE", f"{url}/sessions/{sid}")
    tokens = values.get("tito_stored_tokens", 0.0) or float("nan")
    return {"stored_bytes_per_token": values.get("tito_stored_bytes", 0.0) / tokens,
            "stored_routing_bytes_per_token":
                values.get("tito_stored_routing_bytes", 0.0) / tokens}


def print_profile(path: Path, turns: int) -> None:
    own, incl = top_frames(path)
    print_table("gateway profile: top self frames (% of the GIL-holding samples "
                "over its runs)", ["frame", "self"], own)
    print_table("gateway profile: top tito frames (inclusive)", ["frame", "inclusive"], incl)
    print_table("gateway profile: self samples by package", ["package", "self"],
                by_package(path))
    proxy = proxy_profile_path(path)
    if proxy.is_file():
        print_table("where the gateway's extra time goes: GIL-holding µs per turn by package "
                    "(py-spy self samples / rate / turns)",
                    ["package", "pass-through", "tito gateway", "tito - pass-through"],
                    package_time_per_turn(proxy, path, turns, PySpy.RATE))


def package_time_per_turn(proxy: Path, gateway: Path, turns: int, rate: int
                          ) -> list[list[str]]:
    """Rows of (package, proxy µs/turn, gateway µs/turn, difference), the biggest gateway
    packages first, then the totals."""
    scale = 1e6 / rate / max(1, turns)
    ours, theirs = package_samples(gateway), package_samples(proxy)
    rows = [[k, fmt(theirs.get(k, 0) * scale, 1), fmt(n * scale, 1),
             fmt((n - theirs.get(k, 0)) * scale, 1)] for k, n in ours.most_common(14)]
    total_ours, total_theirs = sum(ours.values()), sum(theirs.values())
    rows.append(["all", fmt(total_theirs * scale, 1), fmt(total_ours * scale, 1),
                 fmt((total_ours - total_theirs) * scale, 1)])
    return rows


def write_json(path: Path, args: argparse.Namespace, wl: Any,
               results: dict[str, dict[str, Any]]) -> None:
    path.write_text(json.dumps({
        "workload": {"sessions": wl.sessions, "turns": wl.turns,
                     "input_tokens": wl.content_tokens, "output_tokens": wl.output_tokens,
                     "append_role": wl.append_role, "latency_ms": args.latency_ms,
                     "token_latency_ms": args.token_latency_ms},
        "results": results,
        "cpu_ratio_paired": paired_cpu_ratios(results.get("passthrough", {}),
                                              results.get("gateway", {}))}, indent=2))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    modes = check_args(args)
    wl = make_workload(args)
    procs: list[Proc] = []
    results: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    try:
        servers = start_servers(args, modes, procs)
        results = run_modes(args, modes, wl, servers)
    finally:
        for proc in reversed(procs):
            proc.stop()
    report(args, wl, results)
    if args.py_spy is not None and args.py_spy.is_file():
        print_profile(args.py_spy, wl.sessions * wl.turns * max(1, args.repeat))
    print(f"total benchmark time {time.perf_counter() - started:.1f} s")
    if args.json:
        write_json(args.json, args, wl, results)
    failed = any(r.get("errors") for r in results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
