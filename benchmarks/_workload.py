"""The conversation every benchmark session plays (:class:`Workload`), precomputed once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _paths  # noqa: F401  (the tree under test on sys.path)

# One-token words (with their leading space) of the Qwen3 vocabulary.
WORDS = ("the quick brown fox jumps over the lazy dog and keeps running through the long "
         "green field while the sun goes down over the quiet hills").split()


@dataclass
class Workload:
    """The conversation every benchmark session plays, precomputed once.

    Every turn appends the same ``appended`` message (``input_tokens`` tokens of content:
    a ``SAY`` directive that makes the mock answer with exactly ``output_tokens`` ids,
    stop id included, padded with filler words) to the history and the assistant reply.
    ``bridge_ids`` are the ids the gateway appends per turn for it (used by the token-level
    baselines, which replay the same prompts without any tokenization).
    """

    sessions: int
    turns: int
    input_tokens: int
    output_tokens: int
    append_role: str
    content: str
    content_tokens: int
    first_prompt_ids: list[list[int]]
    bridge_ids: list[int]
    first_messages: list[list[dict[str, Any]]]
    appended: dict[str, Any]
    max_tokens: int
    notes: list[str] = field(default_factory=list)
    concurrency: int = 0
    """Sessions running at once (0: all of them)."""
    keep_sessions: bool = False
    """Leave the gateway sessions alive after the run (the memory benchmark reads them)."""
    stagger_s: float = 0.0
    """Session i starts i/S of this after the first, so requests do not arrive in bursts."""
    routing: str | None = None
    """Routing replay: ``incremental`` (rows after the stored prefix) or ``full`` (every
    row, every turn); the token baselines ask the engine for the same rows."""


def add_workload_args(p: Any) -> None:
    """The plain workload's flags (an ``argparse`` parser): S sessions at once, T turns each,
    I content tokens appended and O tokens generated per turn."""
    p.add_argument("--sessions", "-S", type=int, default=32, help="concurrent sessions")
    p.add_argument("--turns", "-T", type=int, default=20, help="turns per session")
    p.add_argument("--input-tokens", "-I", type=int, default=64,
                   help="content tokens of the message appended every turn")
    p.add_argument("--output-tokens", "-O", type=int, default=64,
                   help="tokens generated per turn (stop id included; >= 7)")


def say_text(renderer: Any, output_tokens: int) -> str:
    """A SAY text whose reply renders to exactly ``output_tokens`` ids (stop id included)."""
    n = max(1, output_tokens - 6)
    for _ in range(64):
        text = " ".join(WORDS[k % len(WORDS)] for k in range(n))
        got = len(renderer.render_completion({"role": "assistant", "content": text}))
        if got == output_tokens:
            return text
        n += output_tokens - got
        if n < 1:
            break
    raise ValueError(f"cannot script a reply of exactly {output_tokens} tokens "
                     "(the Qwen3 reply overhead is 6 tokens: use --output-tokens >= 7)")


def build_content(tokenizer: Any, say: str, input_tokens: int) -> tuple[str, int]:
    """The appended message text: the SAY line, padded to ``input_tokens`` tokens if room."""
    content = "SAY " + say
    n = len(tokenizer.encode(content))
    if n + 2 > input_tokens:
        return content, n
    pad = input_tokens - n - 1  # "\n" + words
    for _ in range(16):
        line = " ".join(WORDS[k % len(WORDS)] for k in range(max(1, pad)))
        text = content + "\n" + line
        got = len(tokenizer.encode(text))
        if got == input_tokens:
            return text, got
        pad += input_tokens - got
    return text, got


def build_workload(tokenizer_dir: Path, *, sessions: int, turns: int, input_tokens: int,
                   output_tokens: int, append_role: str = "tool") -> Workload:
    from tito.render import build_renderer

    renderer = build_renderer("qwen3", tokenizer_dir)
    say = say_text(renderer, output_tokens)
    content, content_tokens = build_content(renderer.tokenizer, say, input_tokens)
    notes = []
    if content_tokens != input_tokens:
        notes.append(f"the SAY directive for {output_tokens} output tokens needs "
                     f"{content_tokens} content tokens: input per turn is {content_tokens}, "
                     f"not {input_tokens}")
    first: list[list[dict[str, Any]]] = []
    first_ids: list[list[int]] = []
    for i in range(sessions):
        msgs = [{"role": "system", "content": f"You are benchmark agent {i}."},
                {"role": "user", "content": content}]
        first.append(msgs)
        first_ids.append(list(renderer.render_prompt(msgs)))
    appended: dict[str, Any] = {"role": append_role, "content": content}
    if append_role == "tool":
        appended["tool_call_id"] = "call_0"
    reply = {"role": "assistant", "content": say, "reasoning_content": ""}
    bridge = renderer.bridge(reply, renderer.primary_stop_id, [appended])
    assert bridge.drop == 0
    return Workload(sessions, turns, input_tokens, output_tokens, append_role, content,
                    content_tokens, first_ids, list(bridge.ids), first, appended,
                    max_tokens=output_tokens + 16, notes=notes)

