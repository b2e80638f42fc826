"""The benchmark scripts cannot rot: each runs a tiny workload and prints its table.

Not timed: these assert only that the script completes and prints its table(s).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import REPO, tokenizer_dir

pytestmark = pytest.mark.slow  # runs each benchmark, tiny

BENCH = REPO / "benchmarks"


def run_benchmark(script: str, *args: str, tmp_path: Path, tokenizer: bool = True,
                  timeout: float = 300) -> str:
    out = tmp_path / "figures.json"
    folder = ["--tokenizer", str(tokenizer_dir("qwen3"))] if tokenizer else []
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *folder, "--json", str(out), *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"},
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert out.is_file() and out.stat().st_size > 0
    return proc.stdout


def test_gateway_overhead_tiny(tmp_path: Path) -> None:
    out = run_benchmark("gateway_overhead.py", "--sessions", "2", "--turns", "3",
                        "--input-tokens", "16", "--output-tokens", "16", "--repeat", "1",
                        "--r3-bytes-per-token", "1000", tmp_path=tmp_path)
    assert "gateway overhead" in out
    for label in ("turns/s", "latency p50 (ms)", "server CPU per turn (ms)", "direct engine",
                  "pass-through", "tito gateway", "targets"):
        assert label in out, label


def test_gateway_overhead_user_role_tiny(tmp_path: Path) -> None:
    out = run_benchmark("gateway_overhead.py", "--sessions", "2", "--turns", "2",
                        "--input-tokens", "16", "--output-tokens", "12", "--repeat", "1",
                        "--append-role", "user", "--modes", "gateway", tmp_path=tmp_path)
    assert "append=user" in out and "turns/s" in out


def test_gateway_inprocess_tiny(tmp_path: Path) -> None:
    out = run_benchmark("gateway_inprocess.py", "--sessions", "2", "--turns", "3",
                        "--input-tokens", "16", "--output-tokens", "16", "--repeat", "1",
                        "--profile", "5", tmp_path=tmp_path)
    assert "gateway in process" in out
    for label in ("CPU per turn", "floor", "tito's own work", "cumulative"):
        assert label in out, label


def test_loop_stall_tiny(tmp_path: Path) -> None:
    out = run_benchmark("loop_stall.py", "--words", "2000", "--rows", "200", "--repeat", "1",
                        tmp_path=tmp_path)
    assert "event-loop stalls" in out
    for label in ("count_tokens", "samples", "longest /health wait"):
        assert label in out, label


def test_prompt_json_tiny(tmp_path: Path) -> None:
    out = run_benchmark("prompt_json.py", "--sessions", "2", "--turns", "3", "5",
                        "--rounds", "1", tmp_path=tmp_path, tokenizer=False)
    assert "prompt ids as JSON" in out
    for label in ("whole (µs)", "spliced (µs)", "final context"):
        assert label in out, label


def test_tokenizer_encode_tiny(tmp_path: Path) -> None:
    out = run_benchmark("tokenizer_encode.py", "--fixtures", str(tokenizer_dir("qwen3").parent),
                        "--rounds", "2", "--calls", "2", tmp_path=tmp_path, tokenizer=False)
    assert "encoding a turn's appended tool result" in out
    for family in ("qwen3", "llama3", "gpt_oss"):
        assert family in out, family


def test_turn_scaling_tiny(tmp_path: Path) -> None:
    out = run_benchmark("turn_scaling.py", "--turns", "4", "--repeat", "1",
                        "--baseline-reps", "1", "--input-tokens", "16", "--output-tokens", "16",
                        tmp_path=tmp_path)
    assert "turn scaling" in out
    assert "full re-render" in out and "where a turn's work grows" in out


def test_memory_tiny(tmp_path: Path) -> None:
    out = run_benchmark("memory.py", "--sessions", "4", "--turns", "2", "--input-tokens", "32",
                        "--output-tokens", "32", "--samples", "2", "--inprocess-sessions", "2",
                        "--long-turns", "3", tmp_path=tmp_path)
    for label in ("RSS per stored token", "marginal bytes per stored token",
                  "bytes per stored token by owner",
                  "samples payload", "GET /sessions/<id> body size"):
        assert label in out, label


def test_ttft_tiny(tmp_path: Path) -> None:
    out = run_benchmark("ttft.py", "--repeat", "2", "--max-tokens", "8",
                        "--token-latency-ms", "1", tmp_path=tmp_path)
    assert "time to first token" in out
    for label in ("engine /generate stream", "gateway chat, first turn",
                  "gateway messages, first turn", "gateway responses, first turn",
                  "over the engine's own"):
        assert label in out, label


def test_scale_out_tiny(tmp_path: Path) -> None:
    out = run_benchmark("scale_out.py", "--sessions", "4", "--turns", "2", "--concurrency",
                        "2", "--engines", "1,2", "--workers", "1,2", tmp_path=tmp_path)
    assert "several engines" in out and "several gateway workers" in out
    assert "4, 4" in out  # four sessions of two turns over two engines: four requests each


def test_engines_cpu_tiny(tmp_path: Path) -> None:
    # on a new machine: the vLLM virtualenv (~1.5 min) and vLLM's first compile (~2 min)
    out = run_benchmark("engines_cpu.py", "--tokens", "4", "--batches", "1", "--repeat", "1",
                        tmp_path=tmp_path, tokenizer=False, timeout=1200)
    assert "embedded engine vs vLLM-CPU" in out and "startup: embedded" in out


def test_chat_decode_tiny(tmp_path: Path) -> None:
    out = run_benchmark("chat_decode.py", "--sessions", "2", "--turns", "3", "5",
                        "--rounds", "1", tmp_path=tmp_path, tokenizer=False)
    assert "decoding a chat body" in out
    for label in ("whole (µs)", "growing (µs)", "final body"):
        assert label in out, label


@pytest.mark.parametrize(("api", "what"), [("anthropic", "a Messages body"),
                                           ("anthropic --cache-control", "a Messages body"),
                                           ("anthropic --cache-control --claude-code",
                                            "a Messages body"),
                                           ("responses", "a Responses body"),
                                           ("openai --cache-control", "a chat body"),
                                           ("responses --cache-control",
                                            "a Responses body")])
def test_chat_decode_other_routes_tiny(tmp_path: Path, api: str, what: str) -> None:
    out = run_benchmark("chat_decode.py", "--api", *api.split(), "--sessions", "2", "--turns",
                        "3", "5", "--rounds", "1", tmp_path=tmp_path)
    assert f"decoding {what}" in out and "growing (µs)" in out


def test_bridge_standins_tiny(tmp_path: Path) -> None:
    out = run_benchmark("bridge_standins.py", "--turns", "3", "--rounds", "1",
                        tmp_path=tmp_path)
    assert "bridge of a tool-calling turn" in out and "stand-ins" in out


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_gateway_instructions_tiny(tmp_path: Path) -> None:
    out = run_benchmark("gateway_instructions.py", "--apps", "floor", "--sessions", "2",
                        "--turns", "2", "--input-tokens", "16", "--output-tokens", "16",
                        tmp_path=tmp_path, timeout=600)
    assert "instructions per turn" in out and "floor" in out


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="needs py-spy")
def test_gateway_overhead_profiles_both_servers(tmp_path: Path) -> None:
    out = run_benchmark("gateway_overhead.py", "--sessions", "2", "--turns", "3",
                        "--input-tokens", "16", "--output-tokens", "16", "--repeat", "1",
                        "--modes", "passthrough,gateway", "--py-spy",
                        str(tmp_path / "spy.txt"), tmp_path=tmp_path)
    assert "where the gateway's extra time goes" in out
    assert (tmp_path / "spy.txt.proxy").is_file()


def test_stream_cpu_tiny(tmp_path: Path) -> None:
    out = run_benchmark("stream_cpu.py", "--lengths", "64", "256", "--repeat", "1",
                        tmp_path=tmp_path)
    assert "gateway CPU per streamed token" in out and "engine chunks" in out


def test_keepalive_soak_tiny(tmp_path: Path) -> None:
    out = run_benchmark("keepalive_soak.py", "--requests", "20", "--clients", "4", "--gap",
                        "0.05", "0.1", "--keepalive", "75", "--resend", tmp_path=tmp_path)
    assert "keep-alive soak" in out
    for label in ("client errors", "reused after < 5 s idle", "connections"):
        assert label in out, label


@pytest.mark.parametrize("policy", ["keep", "refuse"])
def test_soak_tiny(tmp_path: Path, policy: str) -> None:
    out = run_benchmark("soak.py", "--sessions", "6", "--turns", "6", "--cut-share", "0.4",
                        "--", "--after-length-cut", policy, tmp_path=tmp_path)
    assert "turns committed vs turns in samples" in out and "OK" in out


def test_scale_sessions_tiny(tmp_path: Path) -> None:
    out = run_benchmark("scale_sessions.py", "--sessions", "4", "--turns", "2",
                        "--input-tokens", "64", "--output-tokens", "32", "--probes", "5",
                        "--concurrency", "2", tmp_path=tmp_path)
    for label in ("live sessions", "marginal bytes per token", "projected RSS",
                  "empty gateway", "all sessions live", "added p99"):
        assert label in out, label


def test_workers_scaling_tiny(tmp_path: Path) -> None:
    out = run_benchmark("workers_scaling.py", "--sessions", "4", "--turns", "2",
                        "--input-tokens", "16", "--output-tokens", "16", "--rounds", "1",
                        "--concurrency", "2", tmp_path=tmp_path)
    for label in ("gateway workers", "gateway CPU/turn", "gateway capacity ratio",
                  "measured turns/s ratio"):
        assert label in out, label


def test_harness_traffic_tiny(tmp_path: Path) -> None:
    out = run_benchmark("harness_traffic.py", "-S", "2", "-T", "2", "--tokens", "40", "60",
                        "--system-tokens", "500", tmp_path=tmp_path)
    assert "harness-shaped traffic" in out
    for door in ("messages", "responses", "chat", "chat-nostream"):
        assert door in out, door


def test_family_bridge_tiny(tmp_path: Path) -> None:
    out = run_benchmark("family_bridge.py", "--rounds", "1", "--bridges", "2",
                        tmp_path=tmp_path, tokenizer=False)
    assert "family bridge" in out


def test_reply_cpu_tiny(tmp_path: Path) -> None:
    out = run_benchmark("reply_cpu.py", "--tokens", "50", "--rounds", "1", "--repeat", "2",
                        "--root", str(REPO), tmp_path=tmp_path)
    assert "unstreamed reply" in out
    for label in ("parse_generate_response/50", "reasoning_tokens/50", "first turn"):
        assert label in out, label


@pytest.mark.skipif(shutil.which("mypyc") is None or shutil.which("cc") is None,
                    reason="needs mypyc (from mypy) and a C compiler")
def test_compiled_turn_path_tiny(tmp_path: Path) -> None:
    out = run_benchmark("compiled_turn_path.py", "--modules", "tito/session/idbuffer.py",
                        "--sessions", "2", "--turns", "2", "--input-tokens", "16",
                        "--output-tokens", "16", "--repeat", "1", "--rounds", "1",
                        "--workdir", str(tmp_path / "work"), tmp_path=tmp_path)
    assert "compiled 1 modules with mypyc" in out
    for label in ("compiled turn path", "tito's own work per turn in process",
                  "gateway / pass-through proxy"):
        assert label in out, label
