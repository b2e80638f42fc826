"""Decoding a turn's chat body: parsed whole, against parsed past the session's last body.

Every turn an agent resends its whole history. Decoding it (``orjson`` parse, the check
that it starts with the session's messages, pydantic validation) costs O(context) per
turn when the body is parsed whole; :mod:`tito.server.growing_body` parses only what
follows the session's last body (O(new bytes)), and the earlier messages are last turn's
objects, so the prefix check is an identity check. This script plays S sessions of T
turns, interleaved as a gateway serves them, the bodies serialized as the OpenAI SDK does
(httpx: compact, UTF-8), each turn appending the assistant's reply and a tool result, and
prints the µs per turn of ``decode_chat`` (what the Chat Completions route runs) both
ways (best of R rounds).

``--api anthropic`` does the same for the Messages route's decoding
(:func:`tito.server.anthropic.decode.decode_messages`: parse, validation and the
conversion to chat messages), the client's bodies as the Anthropic SDK sends them (the
system prompt a top-level member, the replies as text and ``tool_use`` blocks, the tool
results as ``tool_result`` blocks).

    python benchmarks/chat_decode.py                  # 20, 80 and 200 turns
    python benchmarks/chat_decode.py --turns 20 --chars 400
    python benchmarks/chat_decode.py --api anthropic
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from _common import QWEN3_DIR, fmt, print_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tito.render import build_renderer
from tito.render.base import TemplateRenderer
from tito.server.anthropic.decode import decode_messages
from tito.server.openai.serving import decode_chat


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, nargs="+", default=[20, 80, 200],
                   help="turns per session (one table row each)")
    p.add_argument("--chars", type=int, default=300,
                   help="characters of each reply and each tool result")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--api", choices=["openai", "anthropic"], default="openai",
                   help="the route whose decoding is timed (Chat Completions or Messages)")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR,
                   help="Qwen3 tokenizer folder (--api anthropic: its thinking switch)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p.parse_args(argv)


def sdk_json(obj: Any) -> bytes:
    """What the OpenAI SDK sends (httpx's ``json=``)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode()


def conversation(turns: int, chars: int) -> list[tuple[bytes, dict[str, Any]]]:
    """(body, the reply the gateway stored for it) of every turn."""
    words = _words(chars)
    messages: list[Any] = [{"role": "system", "content": "You are an agent."},
                           {"role": "user", "content": words}]
    out = []
    for turn in range(turns):
        body = sdk_json({"messages": messages, "model": "m", "max_tokens": 256,
                         "temperature": 1.0})
        reply = {"role": "assistant", "content": f"{turn} {words}"}
        out.append((body, dict(reply)))
        messages = [*messages, reply, {"role": "tool", "tool_call_id": f"call_{turn}",
                                       "content": words}]
    return out


def _words(chars: int) -> str:
    return ("the quick brown fox jumps over the lazy dog; ünïcode ok " * (chars // 40 + 1)
            )[:chars]


def anthropic_conversation(turns: int, chars: int) -> list[tuple[bytes, dict[str, Any]]]:
    """(Messages body, the reply the gateway stored for it) of every turn: each reply is a
    text and a ``tool_use`` block, answered by a ``tool_result``."""
    words = _words(chars)
    messages: list[Any] = [{"role": "user", "content": words}]
    out = []
    for turn in range(turns):
        body = sdk_json({"max_tokens": 256, "messages": messages, "model": "m",
                         "system": "You are an agent.", "temperature": 1.0})
        call_id, text = f"toolu_{turn}", f"{turn} {words}"
        stored = {"role": "assistant", "content": text, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"cmd": "ls"})}}]}
        out.append((body, stored))
        messages = [*messages,
                    {"role": "assistant", "content": [
                        {"type": "text", "text": text},
                        {"type": "tool_use", "id": call_id, "name": "bash",
                         "input": {"cmd": "ls"}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": call_id, "content": words}]}]
    return out


def anthropic_per_turn(turns: list[tuple[bytes, dict[str, Any]]], sessions: int, keep: bool,
                       renderer: TemplateRenderer) -> float:
    """µs per decode_messages, as :func:`per_turn` times decode_chat."""
    states: list[dict[str, Any]] = [{} for _ in range(sessions)]
    stored: list[list[Any]] = [[] for _ in range(sessions)]
    start = time.perf_counter()
    for body, reply in turns:
        for i, state in enumerate(states):
            _, turn = decode_messages(body, renderer, max_depth=64,
                                      api_state=state if keep else None, known=stored[i])
            stored[i] = [*turn.messages, reply]
    return (time.perf_counter() - start) * 1e6 / (len(turns) * sessions)


def per_turn(turns: list[tuple[bytes, dict[str, Any]]], sessions: int, keep: bool) -> float:
    """µs per decode_chat, the sessions' turns interleaved; ``keep``: each session keeps
    its last body (as the route does), else every body is decoded whole. A session's
    stored messages are the client's dicts as decoded, then its own reply (as the gateway
    stores them)."""
    states: list[dict[str, Any]] = [{} for _ in range(sessions)]
    stored: list[list[Any]] = [[] for _ in range(sessions)]
    start = time.perf_counter()
    for body, reply in turns:
        for i, state in enumerate(states):
            decoded = decode_chat(body, stored[i], 64, state if keep else {}, 1024)
            stored[i] = [*decoded.data["messages"], reply]
    return (time.perf_counter() - start) * 1e6 / (len(turns) * sessions)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[list[Any]] = []
    figures = []
    renderer = build_renderer("qwen3", args.tokenizer) if args.api == "anthropic" else None
    for turns in args.turns:
        state: dict[str, Any] = {}
        if renderer is not None:
            seq = anthropic_conversation(turns, args.chars)
            for body, _ in seq:  # both ways decode to the same
                assert decode_messages(body, renderer, max_depth=64, api_state=state)[1] == \
                    decode_messages(body, renderer, max_depth=64)[1]
        else:
            seq = conversation(turns, args.chars)
            for body, _ in seq:
                assert decode_chat(body, [], 64, state, 1024).data == decode_chat(
                    body, [], 64, {}, 1024).data
        whole, grown = [], []
        for _ in range(max(1, args.rounds)):
            if renderer is not None:
                whole.append(anthropic_per_turn(seq, args.sessions, False, renderer))
                grown.append(anthropic_per_turn(seq, args.sessions, True, renderer))
            else:
                whole.append(per_turn(seq, args.sessions, keep=False))
                grown.append(per_turn(seq, args.sessions, keep=True))
        w, g = min(whole), min(grown)
        rows.append([str(turns), f"{len(seq[-1][0]) / 1024:,.0f}", fmt(w, 1), fmt(g, 1),
                     f"{w / g:.1f}x"])
        figures.append({"api": args.api, "turns": turns, "final_body_bytes": len(seq[-1][0]),
                        "whole_us": w, "growing_us": g})
    what = "a Messages body" if renderer is not None else "a chat body"
    print_table(f"decoding {what}, per turn: S={args.sessions} "
                f"{args.chars} characters a message", ["turns", "final body (KiB)",
                                                       "whole (µs)", "growing (µs)",
                                                       "whole / growing"], rows,
                f"best of {args.rounds} round(s); the sessions' turns interleaved; µs per "
                "turn averaged over the session's turns; "
                + ("decode_messages: parse, validation, conversion" if renderer is not None
                   else "decode_chat: parse, prefix check, validation"))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
