"""Qwen3-Coder XML tool calls (Qwen3.5/3.6, Nemotron 3).

``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``;
values are JSON when they parse as JSON objects/arrays/strings/literals, else strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tito.parse.base import make_call
from tito.parse.tagged import Call, TaggedParser, coerce_value, extract_blocks

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FUNC = re.compile(r"^<function=([^>\n]+)>\n?(.*?)\n?</function>$", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _convert(match: re.Match[str]) -> list[Call] | None:
    func = _FUNC.match(match.group(1).strip())
    if func is None:
        return None
    body = func.group(2)
    args: dict[str, Any] = {}
    for param in _PARAM.finditer(body):
        args[param.group(1).strip()] = coerce_value(param.group(2))
    if _PARAM.sub("", body).strip():
        return None  # stray text inside the function block: malformed
    return [make_call(func.group(1).strip(), args)]


@dataclass
class XmlCoderParser(TaggedParser):
    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        return extract_blocks(text, _BLOCK, _convert)
