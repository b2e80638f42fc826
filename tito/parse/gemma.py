"""Gemma 4 completions: ``<|channel>thought\\nR\\n<channel|>`` then text and tool calls.

A call is ``<|tool_call>call:NAME{key:VALUE,…}<tool_call|>`` in Gemma's object syntax:
strings between ``<|"|>`` marks, bare keys, ``true``/``false``/``null``, numbers, ``{…}`` and
``[…]`` (format limit: a string holding ``<|"|>`` cannot be told from its end). The model
stops at ``<turn|>`` or, after its calls, at ``<|tool_response>`` (the results follow in the
same model turn).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tito.parse.base import make_call
from tito.parse.tagged import Call, TaggedParser, extract_blocks

QUOTE = '<|"|>'
_BLOCK = re.compile(r"<\|tool_call>call:([^{}<>\s]+)\{(.*?)\}<tool_call\|>", re.DOTALL)
_NUMBER = re.compile(r"^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?$")
_ATOM_END = re.compile(r"[,}\]]")
_BARE_KEY = re.compile(r"([^,:{}\[\]]+):")


class _Malformed(ValueError):
    pass


def _atom(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if _NUMBER.match(text):
        return json.loads(text)
    return text


def _value(s: str, i: int) -> tuple[Any, int]:
    """The value at ``s[i:]`` and the index after it."""
    if s.startswith(QUOTE, i):
        end = s.find(QUOTE, i + len(QUOTE))
        if end == -1:
            raise _Malformed("unterminated string")
        return s[i + len(QUOTE) : end], end + len(QUOTE)
    if s.startswith("{", i):
        return _object(s, i + 1, "}")
    if s.startswith("[", i):
        items: list[Any] = []
        i += 1
        while not s.startswith("]", i):
            if items:
                i = _expect(s, i, ",")
            item, i = _value(s, i)
            items.append(item)
        return items, i + 1
    match = _ATOM_END.search(s, i)
    end = match.start() if match else len(s)
    if end == i:
        raise _Malformed(f"empty value at {i}")
    return _atom(s[i:end]), end


def _expect(s: str, i: int, mark: str) -> int:
    if not s.startswith(mark, i):
        raise _Malformed(f"expected {mark!r} at {i}")
    return i + len(mark)


def _key(s: str, i: int) -> tuple[str, int]:
    if s.startswith(QUOTE, i):
        key, i = _value(s, i)
        return str(key), _expect(s, i, ":")
    match = _BARE_KEY.match(s, i)
    if match is None:
        raise _Malformed(f"expected a key at {i}")
    return match.group(1), match.end()


def _object(s: str, i: int, close: str | None) -> tuple[dict[str, Any], int]:
    """The pairs from ``s[i:]`` up to ``close`` (None: the end of ``s``)."""
    out: dict[str, Any] = {}
    while not (s.startswith(close, i) if close else i >= len(s)):
        if i >= len(s):
            raise _Malformed("unclosed object")
        if out:
            i = _expect(s, i, ",")
        key, i = _key(s, i)
        out[key], i = _value(s, i)
    return out, i + (1 if close else 0)


def parse_arguments(body: str) -> dict[str, Any] | None:
    """The arguments of one call (the text between its braces); None: malformed."""
    try:
        args, _ = _object(body, 0, None)
    except _Malformed:
        return None
    return args


def _convert(match: re.Match[str]) -> list[Call] | None:
    args = parse_arguments(match.group(2))
    return None if args is None else [make_call(match.group(1), args)]


@dataclass
class GemmaParser(TaggedParser):
    think_start: str | None = "<|channel>thought\n"
    think_end: str | None = "<channel|>"
    think_opened_by_prompt: bool = True

    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        return extract_blocks(text, _BLOCK, _convert)
