"""MiniMax-M3 completions: ``<mm:think>R</mm:think>`` then a namespaced XML tool-call block.

Every tag of a call carries the prefix ``]<]minimax[>[``::

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="N">]<]minimax[>[<k>V]<]minimax[>[</k>]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

Objects are nested elements, arrays ``<item>`` elements; a leaf is ``true``/``false``, a
number, or a string (format limits: a string that reads as a number or a boolean comes back
as one, an empty object or array as ``""``, an object whose only keys are ``item`` as an
array; ``None`` values are not rendered).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tito.parse.base import make_call
from tito.parse.tagged import Call, TaggedParser, extract_blocks

NS = "]<]minimax[>["
_E = re.escape(NS)
_BLOCK = re.compile(_E + r"<tool_call>\n?(.*?)" + _E + r"</tool_call>", re.DOTALL)
_INVOKE = re.compile(_E + r'<invoke name="([^"]+)">(.*?)' + _E + r"</invoke>\n?", re.DOTALL)
_TAG = re.compile(r"^<(/?)([^<>]+)>(.*)$", re.DOTALL)
_NUMBER = re.compile(r"^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?$")


class _Malformed(ValueError):
    pass


def _leaf(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if _NUMBER.match(text):
        return json.loads(text)
    return text


def _elements(pieces: list[str], i: int, close: str | None) -> tuple[list[tuple[str, Any]], int]:
    """The elements from ``pieces[i]`` up to the closing tag ``close`` (None: the end)."""
    items: list[tuple[str, Any]] = []
    while i < len(pieces):
        tag = _TAG.match(pieces[i])
        if tag is None:
            raise _Malformed(pieces[i])
        slash, name, text = tag.groups()
        if slash:
            if name != close or text:
                raise _Malformed(pieces[i])
            return items, i + 1
        if i + 1 < len(pieces) and pieces[i + 1] == f"</{name}>":
            items.append((name, _leaf(text)))
            i += 2
            continue
        if text:
            raise _Malformed(pieces[i])
        children, i = _elements(pieces, i + 1, name)
        items.append((name, _container(children)))
    if close is not None:
        raise _Malformed(f"unclosed <{close}>")
    return items, i


def _container(children: list[tuple[str, Any]]) -> Any:
    if all(k == "item" for k, _ in children):
        return [v for _, v in children]
    return dict(children)


def _arguments(body: str) -> dict[str, Any]:
    if not body:
        return {}
    pieces = body.split(NS)
    if pieces[0]:
        raise _Malformed(pieces[0])
    items, _ = _elements(pieces[1:], 0, None)
    return dict(items)


def _convert(match: re.Match[str]) -> list[Call] | None:
    body = match.group(1)
    calls: list[Call] = []
    try:
        for invoke in _INVOKE.finditer(body):
            calls.append(make_call(invoke.group(1), _arguments(invoke.group(2))))
    except _Malformed:
        return None
    if not calls or _INVOKE.sub("", body).strip():
        return None
    return calls


@dataclass
class MiniMaxM3Parser(TaggedParser):
    think_start: str | None = "<mm:think>"
    think_end: str | None = "</mm:think>"
    think_opened_by_prompt: bool = True

    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        return extract_blocks(text, _BLOCK, _convert)
