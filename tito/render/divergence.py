"""Why two renders diverge: the typed reason of a failed bridge, verification case or
session comparison (:data:`tito.types.mismatch.REASONS`), with the first differing token.

Pure: the caller gives the two texts (or id sequences) and :class:`Hints` about what they
hold (the family's closers and special tokens, the conversation's reasoning and tool
names, where the appended span starts, where held ids meet a bridge); the reason is read
off the text at the first divergence, most specific first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tito.types.tokenizer import Tokenizer

if TYPE_CHECKING:
    from tito.render.base import TemplateRenderer

CONTEXT = 40
"""Characters of text shown either side of the divergence."""
THINK_MARKERS = ("<think>", "</think>", "<mm:think>", "</mm:think>", "◁think▷", "◁/think▷",
                 "<|channel>thought", "<|channel|>analysis", "<seed:think>")
TOOL_MARKERS = ("tool_call", "<function", "<parameter", "\"arguments\"", "<｜tool", "<|tool",
                "to=functions", "[TOOL_CALLS]", "<invoke", "<｜DSML｜", "functions.")
_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|True|False|TRUE|FALSE"
                     r"|null|None|NULL")
_JUNCTION_SLACK = 2
"""Tokens either side of a junction where a differing id counts as a merge across it."""


@dataclass(frozen=True)
class Hints:
    """What the classifier may know about the two sides."""

    closers: tuple[str, ...] = ()
    """Texts that close a turn (the family's stop tokens and history closers)."""
    specials: tuple[str, ...] = ()
    """Special-token texts."""
    reasonings: tuple[str, ...] = ()
    """Reasoning texts of the conversation's assistant messages."""
    tool_names: tuple[str, ...] = ()
    """Names of the tool calls in the conversation."""
    appended_start: int | None = None
    """Character index (in the expected text) where the appended span starts."""
    appended_assistant: bool = False
    """Whether the appended span holds an assistant message."""
    junctions: tuple[int, ...] = ()
    """Token indices where held ids meet a bridge."""


@dataclass(frozen=True)
class Divergence:
    """The first divergence of two renders and its reason (``to_dict``: the wire form)."""

    reason: str
    char_index: int
    expected_text: str
    actual_text: str
    token_index: int | None = None
    expected_id: int | None = None
    actual_id: int | None = None
    expected_token: str | None = None
    actual_token: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def hints_for(renderer: TemplateRenderer, messages: Sequence[dict[str, Any]],
              **extra: Any) -> Hints:
    """Hints from a renderer (closers, special tokens) and the conversation's messages."""
    tok: Tokenizer = renderer.tokenizer
    specials = tuple(t for i in sorted(tok.special_ids) if (t := tok.id_to_token(i)))
    reasonings = tuple(r for m in messages if (r := str(m.get("reasoning_content") or "").strip()))
    names = tuple(str((c.get("function") or {}).get("name") or "")
                  for m in messages for c in m.get("tool_calls") or [])
    return Hints(closers=tuple(renderer.closer_texts), specials=specials,
                 reasonings=reasonings, tool_names=tuple(n for n in names if n), **extra)


def first_char_diff(expected: str, actual: str) -> int:
    return next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b),
                min(len(expected), len(actual)))


def _covering(text: str, n: int, tokens: Sequence[str]) -> str | None:
    """The token of ``tokens`` whose occurrence in ``text`` covers position ``n``."""
    for tok in sorted(tokens, key=len, reverse=True):
        if not tok:
            continue
        i = text.find(tok, max(0, n - len(tok) + 1))
        if 0 <= i <= n:
            return tok
    return None


def _scalar_at(text: str, n: int) -> str | None:
    for m in _SCALAR.finditer(text, max(0, n - 32), n + 32):
        if m.start() <= n <= m.end():
            return m.group()
    return None


def _same_value(a: str, b: str) -> bool:
    words = {"true": True, "false": False, "null": None, "none": None}
    if a.lower() in words or b.lower() in words:
        return a.lower() in words and b.lower() in words and \
            words[a.lower()] is words[b.lower()]
    try:
        return math.isclose(float(a), float(b))
    except ValueError:
        return False


def _closing_reason(expected: str, actual: str, n: int, hints: Hints) -> str | None:
    ce, ca = _covering(expected, n, hints.closers), _covering(actual, n, hints.closers)
    if ce is None and ca is None:
        return None
    if ce is not None and ca is None and _covering(actual, n, hints.specials) is None:
        return "truncated_without_close"
    return "unknown_closing_sequence"


def _reasoning_dropped(expected: str, actual: str, n: int, hints: Hints) -> bool:
    for r in hints.reasonings:
        at = actual.find(r, max(0, n - len(r) - CONTEXT))
        if actual.count(r) > expected.count(r) and 0 <= at <= n + CONTEXT:
            return True
    marker = _covering(actual, n, THINK_MARKERS)
    return marker is not None and _covering(expected, n, (marker,)) is None


def _in_tool_call(expected: str, n: int, hints: Hints) -> bool:
    window = expected[:n]
    cut = max((window.rfind(c) for c in hints.closers), default=-1)
    window = window[cut + 1 :][-600:]
    return any(m in window for m in TOOL_MARKERS) or \
        any(f'"{name}"' in window or f"{name}(" in window or f"={name}" in window
            or f">{name}" in window or f"{name}\n" in window for name in hints.tool_names)


def classify_text(expected: str, actual: str, hints: Hints) -> str:
    """The reason ``actual`` differs from ``expected`` (texts that differ)."""
    n = first_char_diff(expected, actual)
    if _reasoning_dropped(expected, actual, n, hints):
        return "reasoning_dropped"
    closing = _closing_reason(expected, actual, n, hints)
    if closing is not None:
        return closing
    se, sa = _scalar_at(expected, n), _scalar_at(actual, n)
    if se is not None and sa is not None and se != sa and _same_value(se, sa):
        return "value_reserialized"
    if _in_tool_call(expected, n, hints):
        return "tool_call_rerendered"
    if hints.appended_assistant and hints.appended_start is not None and \
            n >= hints.appended_start:
        return "assistant_in_appended_span"
    if _covering(expected, n, hints.specials) or _covering(actual, n, hints.specials):
        return "special_token_differs"
    return "text_differs"


def text_divergence(expected: str, actual: str, hints: Hints) -> Divergence | None:
    """The first divergence of two texts (None: equal)."""
    if expected == actual:
        return None
    n = first_char_diff(expected, actual)
    lo = max(0, n - CONTEXT)
    return Divergence(classify_text(expected, actual, hints), n,
                      expected[lo : n + CONTEXT], actual[lo : n + CONTEXT])


def id_divergence(tok: Tokenizer, expected: Sequence[int], actual: Sequence[int],
                  hints: Hints) -> Divergence | None:
    """The first divergence of two id sequences (None: equal), with its first differing
    token; same text with other ids is ``bpe_merge_across_junction`` near a junction."""
    expected, actual = [int(i) for i in expected], [int(i) for i in actual]
    if expected == actual:
        return None
    k = next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b),
             min(len(expected), len(actual)))
    exp_id = expected[k] if k < len(expected) else None
    act_id = actual[k] if k < len(actual) else None
    exp_text, act_text = tok.decode(expected), tok.decode(actual)
    if exp_text == act_text:
        near = any(abs(k - j) <= _JUNCTION_SLACK for j in hints.junctions)
        n = len(tok.decode(expected[:k]))
        reason = "bpe_merge_across_junction" if near else "tokenization_differs"
    else:
        n = first_char_diff(exp_text, act_text)
        reason = classify_text(exp_text, act_text, hints)
        special = tok.special_ids
        if reason == "text_differs" and (exp_id in special or act_id in special):
            reason = "special_token_differs"
    lo = max(0, n - CONTEXT)
    return Divergence(reason, n, exp_text[lo : n + CONTEXT], act_text[lo : n + CONTEXT], k,
                      exp_id, act_id, None if exp_id is None else tok.decode([exp_id]),
                      None if act_id is None else tok.decode([act_id]))
