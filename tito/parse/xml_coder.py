"""Qwen3-Coder XML tool calls (Qwen3.5/3.6, Nemotron 3).

``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``;
values are JSON when they parse as JSON objects/arrays/strings/literals, else strings.
Templates that print non-string values with Jinja's ``string`` filter (Qwen3.5, Nemotron 3
and 3.5) write Python's ``True``/``False``/``None``: with ``python_literals`` those read
back as booleans and null (a string argument that is exactly ``True`` reads back as a
boolean: the format cannot tell them apart).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Any

from tito.parse.base import make_call
from tito.parse.tagged import Call, TaggedParser, coerce_value, extract_blocks

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FUNC = re.compile(r"^<function=([^>\n]+)>\n?(.*?)\n?</function>$", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


_PYTHON_LITERALS: dict[str, Any] = {"True": True, "False": False, "None": None}


def _value(raw: str, python_literals: bool) -> Any:
    if python_literals and raw.strip() in _PYTHON_LITERALS:
        return _PYTHON_LITERALS[raw.strip()]
    return coerce_value(raw)


def _convert(match: re.Match[str], python_literals: bool = False) -> list[Call] | None:
    func = _FUNC.match(match.group(1).strip())
    if func is None:
        return None
    body = func.group(2)
    args: dict[str, Any] = {}
    for param in _PARAM.finditer(body):
        args[param.group(1).strip()] = _value(param.group(2), python_literals)
    if _PARAM.sub("", body).strip():
        return None  # stray text inside the function block: malformed
    return [make_call(func.group(1).strip(), args)]


@dataclass
class XmlCoderParser(TaggedParser):
    python_literals: bool = False
    """The template writes booleans and null as Python's ``True``/``False``/``None``."""

    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        return extract_blocks(text, _BLOCK, partial(_convert, python_literals=self.python_literals))
