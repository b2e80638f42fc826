"""Throughput of the embedded engine vs plain ``transformers`` ``generate()``, same model.

    python benchmarks/embedded_engine.py [--tokens 64] [--batches 1,4,8,16] [--threads N]
                                         [--linear auto|onednn|mkl] [--repeat 2]

For each batch size B, B chat prompts are generated to exactly ``--tokens`` new tokens each
(greedy; eos is not a stop here so every request does the same work) and the aggregate
tokens/s is total new tokens / wall time, prefill included. Columns:

- ``ours``: B concurrent ``EmbeddedEngine.generate`` calls (continuous batching);
- ``generate() seq``: what a server without batching does with B requests: one
  ``generate()`` call per request, one after the other (measured once, at batch 1: the
  aggregate rate does not depend on B);
- ``generate() padded``: one ``generate()`` call with the B prompts left-padded into a
  static batch (needs all requests up front; no joining or leaving).

Both sides run with the same number of torch threads (``--threads``, default: the engine's
default, all cores but one). Peak RSS is the process's (``ru_maxrss``) after our runs and at
the end. The machine should be otherwise idle: on 2 cores any other process shows up
directly in the numbers (``--repeat`` keeps the best of several runs per cell).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from tito.engines.embedded import EmbeddedEngine
from tito.engines.embedded_scheduler import default_threads
from tito.types.engine import SamplingParams

TOPICS = [
    "the sea", "a lighthouse", "mountains", "a city at night", "a robot", "winter", "a library",
    "the moon", "a garden", "trains", "a storm", "coffee", "a desert", "music", "a forest",
    "the stars",
]


def prompts(engine: EmbeddedEngine, n: int) -> list[list[int]]:
    tok = engine.tokenizer
    return [
        tok.encode(
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            f"Face<|im_end|>\n<|im_start|>user\nWrite a long story about {TOPICS[i % 16]}."
            "<|im_end|>\n<|im_start|>assistant\n"
        )
        for i in range(n)
    ]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def run_ours(engine: EmbeddedEngine, batch: list[list[int]], tokens: int) -> float:
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0)
    t = time.perf_counter()
    results = await asyncio.gather(
        *(engine.generate(p, params, f"bench-{i}") for i, p in enumerate(batch))
    )
    dt = time.perf_counter() - t
    total = sum(len(r.output_ids) for r in results)
    assert total == tokens * len(batch), "every request must generate --tokens tokens"
    return total / dt


def run_generate(model: torch.nn.Module, batch: list[list[int]], tokens: int) -> float:
    width = max(len(p) for p in batch)
    ids = torch.full((len(batch), width), 2, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, p in enumerate(batch):  # left padding
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
            do_sample=False, pad_token_id=2, eos_token_id=2,
        )
    dt = time.perf_counter() - t
    assert out.shape[1] - width == tokens
    return tokens * len(batch) / dt


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    ap.add_argument("--batches", default="1,4,8,16", help="comma-separated batch sizes")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for both sides (default: all cores but one)")
    ap.add_argument("--linear", default="auto", help="our matmul backend: auto|onednn|mkl")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell (the best is kept)")
    ap.add_argument("--skip-generate", action="store_true", help="only measure our engine")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    threads = args.threads or default_threads()
    torch.set_num_threads(threads)
    batches = [int(b) for b in args.batches.split(",")]

    t = time.perf_counter()
    engine = await EmbeddedEngine.create(
        max_batch_size=max(batches), num_threads=threads, linear=args.linear
    )
    load_s = time.perf_counter() - t
    engine.stop_token_ids = frozenset()  # benchmark only: run every request to --tokens
    every = prompts(engine, max(batches))
    await run_ours(engine, every[:2], 4)  # warm-up

    ours: dict[int, float] = {}
    for b in batches:
        ours[b] = max([await run_ours(engine, every[:b], args.tokens) for _ in range(args.repeat)])
        print(f"  ours        B={b:<3} {ours[b]:7.1f} tok/s", file=sys.stderr)
    rss_ours = peak_rss_mib()
    await engine.close()

    seq: float | None = None
    padded: dict[int, float] = {}
    if not args.skip_generate:
        torch.set_num_threads(threads)
        model = engine.reference_model()
        run_generate(model, every[:1], 4)  # warm-up
        seq = max(run_generate(model, every[:1], args.tokens) for _ in range(args.repeat))
        print(f"  generate()  B=1   {seq:7.1f} tok/s", file=sys.stderr)
        for b in batches:
            padded[b] = max(
                run_generate(model, every[:b], args.tokens) for _ in range(args.repeat)
            )
            print(f"  generate()  B={b:<3} {padded[b]:7.1f} tok/s (padded)", file=sys.stderr)

    print(f"\nSmolLM2-135M-Instruct fp32, CPU torch {torch.__version__}, "
          f"{threads} torch threads, {os.cpu_count()} cores, matmuls: "
          f"ours {engine.model.linear_backend}, generate() MKL; "
          f"{args.tokens} new tokens per request, prompts ~{len(every[0])} tokens; "
          f"engine load {load_s:.1f} s ({'cache' if engine.weights.from_cache else 'GGUF'})\n")
    print("| batch | ours tok/s | generate() seq tok/s | generate() padded tok/s "
          "| ours / seq | ours / padded |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b in batches:
        s = f"{seq:.1f}" if seq else "-"
        p = f"{padded[b]:.1f}" if b in padded else "-"
        r1 = f"{ours[b] / seq:.1f}x" if seq else "-"
        r2 = f"{ours[b] / padded[b]:.1f}x" if b in padded else "-"
        print(f"| {b} | {ours[b]:.1f} | {s} | {p} | {r1} | {r2} |")
    print(f"\npeak RSS: {rss_ours:.0f} MiB after our engine, {peak_rss_mib():.0f} MiB at the end")
    if args.json:
        args.json.write_text(json.dumps({
            "tokens_per_request": args.tokens, "threads": threads,
            "linear": engine.model.linear_backend, "load_s": load_s,
            "ours_tok_s": ours, "generate_seq_tok_s": seq, "generate_padded_tok_s": padded,
            "peak_rss_mib_ours": rss_ours, "peak_rss_mib_end": peak_rss_mib(),
        }, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
