"""GLM-4.5..4.7 completions: ``<think>R</think>`` then
``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`` blocks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tito.parse.base import make_call
from tito.parse.tagged import Call, TaggedParser, coerce_value, extract_blocks

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _convert(match: re.Match[str]) -> list[Call] | None:
    body = match.group(1)
    name, sep, _ = body.partition("<arg_key>")
    name = name.strip()
    if not name or "<" in name or "\n" in name:
        return None
    args: dict[str, Any] = {}
    for arg in _ARG.finditer(body):
        args[arg.group(1).strip()] = coerce_value(arg.group(2))
    rest = _ARG.sub("", body[len(body.partition("<arg_key>")[0]):]) if sep else ""
    if rest.strip():
        return None
    return [make_call(name, args)]


@dataclass
class GlmParser(TaggedParser):
    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        return extract_blocks(text, _BLOCK, _convert)
