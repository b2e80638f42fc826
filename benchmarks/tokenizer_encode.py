"""Tokenizing a turn's appended messages: the original, ``tiktoken`` as is, and ours.

For each family whose fixture tokenizer gets the fast encoder (``tito/types/fast_bpe.py``),
a rendered conversation tail (a tool result in the family's own template, with its
special tokens, then the generation prompt) is encoded by: the ``tokenizers`` original;
``tiktoken`` with every added token allowed (``encode(allowed_special=...)``, which
converts the allowed set to a Rust hash set on every call); and ours (the added tokens
matched by a trie regex, the text between them encoded as ordinary text). Best of R rounds
of N calls, µs per call; all three give the same ids.

    python benchmarks/tokenizer_encode.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _paths import QWEN3_DIR
from _tables import fmt, print_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tito.render import build_renderer
from tito.types.fast_bpe import fast_codec

FAMILIES = {"qwen3": "qwen3", "llama3": "llama-3.1", "gpt_oss": "gpt-oss"}
"""Family -> fixture folder (the fixtures whose tokenizers get the fast encoder)."""
CONTENT = ("SAY the quick brown fox jumps over the lazy dog and keeps running through the "
           "long green field while the sun goes down over the quiet hills. ") * 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixtures", type=Path, default=QWEN3_DIR.parent,
                   help="the folder of the fixture tokenizers")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--calls", type=int, default=20, help="calls per round")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p.parse_args(argv)


def tail_text(renderer: Any) -> str:
    """The text a turn appends: a tool result in the family's template + the generation
    prompt (a full render minus the render of the conversation before it)."""
    call = {"id": "call_0", "type": "function",
            "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}
    head = [{"role": "user", "content": "list the files"},
            {"role": "assistant", "content": "", "tool_calls": [call]}]
    tool = {"role": "tool", "content": CONTENT, "tool_call_id": "call_0"}
    before = renderer.render_text(head)
    full = renderer.render_text([*head, tool], add_generation_prompt=True)
    return full[len(before):] if full.startswith(before) else full


def best_us(fn: Callable[[], Any], rounds: int, calls: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def measure(family: str, path: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """The three encoders' µs per call on ``family``'s tail text (None: no fast encoder)."""
    renderer = build_renderer(family, path)
    backend = renderer.tokenizer.backend
    codec = fast_codec(backend, (path / "tokenizer.json").read_bytes())
    if codec is None:
        return None
    text = tail_text(renderer)
    encoding, ours = codec.encoding, codec.encode
    added = frozenset(encoding.special_tokens_set)
    calls: dict[str, Callable[[], Any]] = {
        "tokenizers": lambda: backend.encode(text, add_special_tokens=False).ids,
        "tiktoken allowed_special": lambda: encoding.encode(text, allowed_special=added),
        "ours": lambda: ours(text),
    }
    ids = {name: list(fn()) for name, fn in calls.items()}
    assert len({tuple(v) for v in ids.values()}) == 1, f"{family}: the ids differ"
    return {"family": family, "added_tokens": len(added), "tokens": len(ids["ours"]),
            "us": {name: best_us(fn, args.rounds, args.calls) for name, fn in calls.items()}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = []
    for family, folder in FAMILIES.items():
        path = args.fixtures / folder
        figure = measure(family, path, args) if path.is_dir() else None
        if figure is None:
            print(f"skipping {family}: no fixture at {path}, or no fast encoder")
            continue
        figures.append(figure)
    rows = [[f["family"], str(f["added_tokens"]), str(f["tokens"]),
             *(fmt(v) for v in f["us"].values())] for f in figures]
    print_table("encoding a turn's appended tool result (µs per call, best of "
                f"{args.rounds} rounds of {args.calls})",
                ["family", "added tokens", "ids", "tokenizers", "tiktoken allowed_special",
                 "ours"], rows, "the same ids from all three")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
