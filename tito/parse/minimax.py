"""MiniMax-M2 completions: ``<think>\\nR\\n</think>\\n\\n`` then a ``<minimax:tool_call>``
block of ``<invoke name="N"><parameter name="K">V</parameter>...</invoke>`` items."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tito.parse.base import make_call
from tito.parse.tagged import Call, TaggedParser, coerce_value, extract_blocks

_BLOCK = re.compile(r"\n?<minimax:tool_call>\n?(.*?)</minimax:tool_call>", re.DOTALL)
_INVOKE = re.compile(r'<invoke name="([^"]+)">\n?(.*?)</invoke>\n?', re.DOTALL)
_PARAM = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>\n?', re.DOTALL)


def _convert(match: re.Match[str]) -> list[Call] | None:
    body = match.group(1)
    calls: list[Call] = []
    for invoke in _INVOKE.finditer(body):
        args: dict[str, Any] = {}
        for param in _PARAM.finditer(invoke.group(2)):
            args[param.group(1)] = coerce_value(param.group(2))
        if _PARAM.sub("", invoke.group(2)).strip():
            return None
        calls.append(make_call(invoke.group(1), args))
    if not calls or _INVOKE.sub("", body).strip():
        return None
    return calls


@dataclass
class MiniMaxParser(TaggedParser):
    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        return extract_blocks(text, _BLOCK, _convert)
