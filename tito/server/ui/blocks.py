"""Blocks of a token strip: thinking, tool calls, tool results (pure).

A block is a token range ``[start, end)`` with a kind and a label, found in the text of
one segment of a trajectory: thinking and tool calls inside generated segments, tool
results inside bridge segments (the ids the gateway inserted for appended tool
messages). Markers are those of the families the gateway serves; when a segment's
messages say there are tool calls or tool results but no marker is found (a family that
writes calls as bare JSON, say), the block falls back to the call's place after the
thinking, or to the tool message's text found in the bridge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PROMPT, BRIDGE, GENERATED = 0, 1, 2
"""Origins of a token: the first turn's prompt, ids the gateway inserted, model output."""

Pair = tuple[str, str | None]
"""(opening marker, closing marker); None: the block runs to the segment's end."""
THINK: tuple[Pair, ...] = (
    ("<think>", "</think>"), ("◁think▷", "◁/think▷"),
    ("<|channel|>analysis<|message|>", "<|end|>"),
)
OPENED_BY_PROMPT: tuple[str, ...] = ("</think>", "◁/think▷")
"""Closing markers of a thinking block the generation prompt may have opened."""
TOOL_CALL: tuple[Pair, ...] = (
    ("<tool_call>", "</tool_call>"), ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"),
    ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
    ("<minimax:tool_call>", "</minimax:tool_call>"), ("<tool_calls>", "</tool_calls>"),
    ("to=functions.", "<|call|>"), ("[TOOL_CALLS]", None), ("<|python_tag|>", None),
)
TOOL_RESULT: tuple[Pair, ...] = (
    ("<tool_response>", "</tool_response>"), ("<tool_result>", "</tool_result>"),
    ("<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"),
    ("[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
    ("<|start_header_id|>ipython<|end_header_id|>", "<|eot_id|>"),
    ("<|start|>functions.", "<|end|>"), ("<|im_system|>tool<|im_middle|>", "<|im_end|>"),
)
_CALL_NAME = re.compile(
    r'"name"\s*:\s*"([^"]+)"|<function=([^>\s]+)|invoke name="([^"]+)"'
    r"|to=functions\.([\w.\-]+)|<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>)?([\w.\-]+)")


@dataclass(frozen=True, slots=True)
class Hints:
    """What a segment's messages say: the names of the assistant's tool calls (generated
    segment) or the appended tool messages as (name, content) (bridge segment)."""

    tool_calls: tuple[str, ...] = ()
    tool_results: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Segment:
    start: int
    end: int
    origin: int
    turn: int
    hints: Hints = field(default_factory=Hints)


def find_blocks(texts: list[str], segments: list[Segment]) -> list[dict[str, Any]]:
    """Every block of the trajectory, in token order (blocks never overlap)."""
    blocks: list[dict[str, Any]] = []
    for seg in segments:
        if seg.end <= seg.start or seg.origin == PROMPT:
            continue
        pieces = texts[seg.start : seg.end]
        text = "".join(pieces)
        ends = np.cumsum([len(p) for p in pieces])
        found = _generated(text, seg.hints) if seg.origin == GENERATED else \
            _bridge(text, seg.hints)
        for kind, (a, b), label in found:
            lo = seg.start + int(np.searchsorted(ends, a, side="right"))
            hi = seg.start + int(np.searchsorted(ends, max(a, b - 1), side="right")) + 1
            blocks.append({"kind": kind, "start": lo, "end": min(hi, seg.end),
                           "label": label, "turn": seg.turn})
    return blocks


Found = list[tuple[str, tuple[int, int], str]]


def _generated(text: str, hints: Hints) -> Found:
    found: Found = [("think", span, "thinking") for span in _thinking(text)]
    after = max((b for _, (_, b), _ in found), default=0)
    calls = _spans(text, TOOL_CALL, after)
    if not calls and hints.tool_calls:  # a format without markers: the call follows
        start = len(text) - len(text[after:].lstrip())
        calls = [(start, len(text))] if start < len(text) else []
    for k, (a, b) in enumerate(calls):
        names = list(hints.tool_calls) if len(calls) == 1 else \
            [hints.tool_calls[k]] if len(calls) == len(hints.tool_calls) else \
            _call_names(text[a:b])
        label = "tool call" + (": " + ", ".join(names) if names else "")
        found.append(("tool_call", (a, b), label))
    return found


def _bridge(text: str, hints: Hints) -> Found:
    spans = _spans(text, TOOL_RESULT, 0)
    if not spans:  # no marker: find each tool message's text
        cursor = 0
        for _, content in hints.tool_results:
            at = text.find(content, cursor) if content else -1
            if at >= 0:
                spans.append((at, at + len(content)))
                cursor = at + len(content)
    named = len(spans) == len(hints.tool_results)
    return [("tool_result", span, "tool result" + (
        f": {hints.tool_results[k][0]}" if named and hints.tool_results[k][0] else ""))
        for k, span in enumerate(spans)]


def _thinking(text: str) -> list[tuple[int, int]]:
    spans = _spans(text, THINK, 0)
    for close in OPENED_BY_PROMPT:
        b = text.find(close)
        if b >= 0 and not any(a <= b < e for a, e in spans):  # opened by the prompt
            spans.insert(0, (0, b + len(close)))
            break
    return spans


def _spans(text: str, pairs: tuple[Pair, ...], start: int) -> list[tuple[int, int]]:
    """Non-overlapping marker spans from ``start`` on, in text order."""
    candidates: list[tuple[int, int]] = []
    for opening, closing in pairs:
        pos = start
        while (a := text.find(opening, pos)) >= 0:
            b = -1 if closing is None else text.find(closing, a + len(opening))
            end = len(text) if b < 0 else b + len(closing or "")
            candidates.append((a, end))
            pos = end
    spans: list[tuple[int, int]] = []
    for a, b in sorted(candidates):
        if not spans or a >= spans[-1][1]:
            spans.append((a, b))
    return spans


def _call_names(text: str) -> list[str]:
    return [next(g for g in m.groups() if g) for m in _CALL_NAME.finditer(text)]
