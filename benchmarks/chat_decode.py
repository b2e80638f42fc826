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

``--api responses`` does the same for the Responses route's decoding of a client that
resends its whole conversation as ``input`` (no ``previous_response_id``;
:func:`tito.server.responses.decode.decode_responses`), each turn's output echoed back as
reasoning, message and ``function_call`` items and answered by a
``function_call_output``. ``--api anthropic`` does the same for the Messages route's decoding
(:func:`tito.server.anthropic.decode.decode_messages`: parse, validation and the
conversion to chat messages), the client's bodies as the Anthropic SDK sends them (the
system prompt a top-level member, the replies as text and ``tool_use`` blocks, the tool
results as ``tool_result`` blocks); with ``--cache-control``, as Claude Code sends them:
a ``cache_control`` marker on the newest message's last block only, so the last body's
last message comes back rewritten every turn.

    python benchmarks/chat_decode.py                  # 20, 80 and 200 turns
    python benchmarks/chat_decode.py --turns 20 --chars 400
    python benchmarks/chat_decode.py --api anthropic
    python benchmarks/chat_decode.py --api anthropic --cache-control   # as Claude Code
    python benchmarks/chat_decode.py --api responses
    python benchmarks/chat_decode.py --api openai --cache-control      # the same on Chat
    python benchmarks/chat_decode.py --api anthropic --cache-control --claude-code --turns 2

``--claude-code`` (``--api anthropic``): the system prompt and tool list of Claude Code's
captured body (``tests/harnesses/fixtures/claude_code/bash_1.json``, ~100 KB) instead of
a one-line system prompt; with ``--turns 2`` the rows show a session's first two bodies,
the second of which rewrites the first's only message.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _paths import QWEN3_DIR
from _tables import fmt, print_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tito.render import build_renderer
from tito.render.base import TemplateRenderer
from tito.server.anthropic.decode import decode_messages
from tito.server.api_state import ApiState
from tito.server.openai.decode import decode_chat
from tito.server.responses.convert import chat_messages as responses_chat
from tito.server.responses.decode import decode_responses
from tito.server.responses.models import parse_item


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, nargs="+", default=[20, 80, 200],
                   help="turns per session (one table row each)")
    p.add_argument("--chars", type=int, default=300,
                   help="characters of each reply and each tool result")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--api", choices=["openai", "anthropic", "responses"],
                   default="openai", help="the route whose decoding is timed (Chat "
                   "Completions, Messages or Responses)")
    p.add_argument("--cache-control", action="store_true",
                   help="a cache_control marker on the newest message only, moving every "
                   "turn (Claude Code's on Messages; a text part's on Chat; an item's on "
                   "Responses)")
    p.add_argument("--claude-code", action="store_true",
                   help="--api anthropic: Claude Code's captured system prompt and tools")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR,
                   help="Qwen3 tokenizer folder (--api anthropic: its thinking switch)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p.parse_args(argv)


def sdk_json(obj: Any) -> bytes:
    """What the OpenAI SDK sends (httpx's ``json=``)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode()


MARK = {"cache_control": {"type": "ephemeral"}}


def conversation(turns: int, chars: int, cache_control: bool = False
                 ) -> list[tuple[bytes, dict[str, Any]]]:
    """(body, the reply the gateway stored for it) of every turn; ``cache_control``: the
    newest message's content as a text part with a cache marker (as OpenAI-compatible
    clients of caching providers send it), so the last body's last message comes back
    rewritten."""
    words = _words(chars)
    messages: list[Any] = [{"role": "system", "content": "You are an agent."},
                           {"role": "user", "content": words}]
    out = []
    for turn in range(turns):
        last = {**messages[-1], "content": [{"type": "text", "text": messages[-1]["content"],
                                             **MARK}]}
        sent = [*messages[:-1], last] if cache_control else messages
        body = sdk_json({"messages": sent, "model": "m", "max_tokens": 256,
                         "temperature": 1.0})
        reply = {"role": "assistant", "content": f"{turn} {words}"}
        out.append((body, dict(reply)))
        messages = [*messages, reply, {"role": "tool", "tool_call_id": f"call_{turn}",
                                       "content": words}]
    return out


def _words(chars: int) -> str:
    return ("the quick brown fox jumps over the lazy dog; ünïcode ok " * (chars // 40 + 1)
            )[:chars]


def marked(messages: list[Any]) -> list[Any]:
    """``messages`` with Claude Code's ``cache_control`` marker on the last one's last
    block (a string content becomes one text block)."""
    last = dict(messages[-1])
    blocks = last["content"]
    if isinstance(blocks, str):
        blocks = [{"type": "text", "text": blocks}]
    last["content"] = [*blocks[:-1], {**blocks[-1], "cache_control": {"type": "ephemeral"}}]
    return [*messages[:-1], last]


def claude_code_rest() -> dict[str, Any]:
    """The system prompt and tools of Claude Code's captured body."""
    fixtures = Path(__file__).resolve().parents[1] / "tests" / "harnesses" / "fixtures"
    body = json.loads((fixtures / "claude_code" / "bash_1.json").read_text())["body"]
    tools = body["tools"]
    if isinstance(tools, str):  # "@tools-<n>-<hash>.json": stored once
        tools = json.loads((fixtures / "claude_code" / tools[1:]).read_text())
    return {"system": body["system"], "tools": tools}


def anthropic_conversation(turns: int, chars: int, cache_control: bool = False,
                           claude_code: bool = False) -> list[tuple[bytes, dict[str, Any]]]:
    """(Messages body, the reply the gateway stored for it) of every turn: each reply is a
    text and a ``tool_use`` block, answered by a ``tool_result``."""
    words = _words(chars)
    messages: list[Any] = [{"role": "user", "content": words}]
    rest = claude_code_rest() if claude_code else {"system": "You are an agent."}
    out = []
    for turn in range(turns):
        body = sdk_json({"max_tokens": 256,
                         "messages": marked(messages) if cache_control else messages,
                         "model": "m", **rest, "temperature": 1.0})
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


def responses_conversation(turns: int, chars: int, cache_control: bool = False
                           ) -> list[tuple[bytes, dict[str, Any]]]:
    """(Responses body, the reply the gateway stored for it) of every turn;
    ``cache_control``: a marker on the newest item only."""
    words = _words(chars)
    items: list[Any] = [{"role": "user", "content": words}]
    out = []
    for turn in range(turns):
        sent = [*items[:-1], {**items[-1], **MARK}] if cache_control else items
        body = sdk_json({"model": "m", "input": sent, "instructions": "You are an agent.",
                         "max_output_tokens": 256})
        echoed = [{"type": "reasoning", "id": f"rs_{turn}",
                   "summary": [{"type": "summary_text", "text": words[:60]}]},
                  {"type": "message", "role": "assistant",
                   "content": [{"type": "output_text", "text": f"{turn} {words}"}]},
                  {"type": "function_call", "call_id": f"call_{turn}", "name": "bash",
                   "arguments": json.dumps({"cmd": "ls"})}]
        stored = responses_chat([parse_item(item, i) for i, item in enumerate(echoed)])[0]
        out.append((body, stored))
        items = [*items, *echoed, {"type": "function_call_output",
                                   "call_id": f"call_{turn}", "output": words}]
    return out


def responses_per_turn(turns: list[tuple[bytes, dict[str, Any]]], sessions: int,
                       keep: bool) -> float:
    """µs per decode_responses, as :func:`per_turn` times decode_chat."""
    states = [ApiState() for _ in range(sessions)]
    stored: list[list[Any]] = [[] for _ in range(sessions)]
    start = time.perf_counter()
    for body, reply in turns:
        for i, state in enumerate(states):
            request, messages = decode_responses(body, 64, state=state if keep else None,
                                                 stored=stored[i])
            system = {"role": "system", "content": request.instructions}
            stored[i] = [system, *messages, reply]
    return (time.perf_counter() - start) * 1e6 / (len(turns) * sessions)


def anthropic_per_turn(turns: list[tuple[bytes, dict[str, Any]]], sessions: int, keep: bool,
                       renderer: TemplateRenderer) -> float:
    """µs per decode_messages, as :func:`per_turn` times decode_chat."""
    states = [ApiState() for _ in range(sessions)]
    stored: list[list[Any]] = [[] for _ in range(sessions)]
    start = time.perf_counter()
    for body, reply in turns:
        for i, state in enumerate(states):
            _, turn = decode_messages(body, renderer, max_depth=64,
                                      state=state if keep else None, stored=stored[i])
            stored[i] = [*turn.messages, reply]
    return (time.perf_counter() - start) * 1e6 / (len(turns) * sessions)


def per_turn(turns: list[tuple[bytes, dict[str, Any]]], sessions: int, keep: bool) -> float:
    """µs per decode_chat, the sessions' turns interleaved; ``keep``: each session keeps
    its last body (as the route does), else every body is decoded whole. A session's
    stored messages are the client's dicts as decoded, then its own reply (as the gateway
    stores them)."""
    states = [ApiState() for _ in range(sessions)]
    stored: list[list[Any]] = [[] for _ in range(sessions)]
    start = time.perf_counter()
    for body, reply in turns:
        for i, state in enumerate(states):
            decoded = decode_chat(body, stored[i], 64, state if keep else ApiState(), 1024)
            stored[i] = [*decoded.data["messages"], reply]
    return (time.perf_counter() - start) * 1e6 / (len(turns) * sessions)


@dataclass
class Route:
    """How one API's decoding is played: its conversation, the decode of one body (``state``:
    the session's API state, None: whole), and a session's timed turns."""

    what: str
    steps: str
    conversation: Callable[[int, int], list[tuple[bytes, dict[str, Any]]]]
    decode: Callable[[bytes, ApiState | None], Any]
    per_turn: Callable[[list[tuple[bytes, dict[str, Any]]], int, bool], float]


def route_of(args: argparse.Namespace) -> Route:
    if args.api == "responses":
        return Route("a Responses body", "decode_responses: parse, validation, conversion",
                     lambda turns, chars: responses_conversation(turns, chars,
                                                                 args.cache_control),
                     lambda body, state: decode_responses(body, 64, state=state),
                     responses_per_turn)
    if args.api == "anthropic":
        renderer = build_renderer("qwen3", args.tokenizer)
        return Route("a Messages body", "decode_messages: parse, validation, conversion",
                     lambda turns, chars: anthropic_conversation(
                         turns, chars, args.cache_control, args.claude_code),
                     lambda body, state: decode_messages(body, renderer, max_depth=64,
                                                         state=state)[1],
                     lambda seq, sessions, keep: anthropic_per_turn(seq, sessions, keep,
                                                                    renderer))
    return Route("a chat body", "decode_chat: parse, prefix check, validation",
                 lambda turns, chars: conversation(turns, chars, args.cache_control),
                 lambda body, state: decode_chat(
                     body, [], 64, ApiState() if state is None else state, 1024).data,
                 lambda seq, sessions, keep: per_turn(seq, sessions, keep=keep))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    route = route_of(args)
    rows: list[list[Any]] = []
    figures = []
    for turns in args.turns:
        seq = route.conversation(turns, args.chars)
        state = ApiState()
        for body, _ in seq:  # both ways decode to the same
            assert route.decode(body, state) == route.decode(body, None)
        whole, grown = [], []
        for _ in range(max(1, args.rounds)):
            whole.append(route.per_turn(seq, args.sessions, False))
            grown.append(route.per_turn(seq, args.sessions, True))
        w, g = min(whole), min(grown)
        rows.append([str(turns), f"{len(seq[-1][0]) / 1024:,.0f}", fmt(w, 1), fmt(g, 1),
                     f"{w / g:.1f}x"])
        figures.append({"api": args.api, "turns": turns, "final_body_bytes": len(seq[-1][0]),
                        "whole_us": w, "growing_us": g})
    print_table(f"decoding {route.what}, per turn: S={args.sessions} "
                f"{args.chars} characters a message", ["turns", "final body (KiB)",
                                                       "whole (µs)", "growing (µs)",
                                                       "whole / growing"], rows,
                f"best of {args.rounds} round(s); the sessions' turns interleaved; µs per "
                f"turn averaged over the session's turns; {route.steps}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
