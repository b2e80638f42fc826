"""DeepSeek completions.

- V3.1: ``<｜tool▁calls▁begin｜>(<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>JSON<｜tool▁call▁end｜>)+
  <｜tool▁calls▁end｜>``.
- V3.2 / V4 (DSML): ``<｜DSML｜function_calls>`` (V3.2) or ``<｜DSML｜tool_calls>`` (V4) holding
  ``<｜DSML｜invoke name="N">`` with ``<｜DSML｜parameter name="K" string="true|false">V`` items;
  ``string="false"`` values are JSON.
- V4.1: the same with a space after the DSML token in every tag and ``calls`` for
  ``tool_calls`` (``<｜DSML｜ calls>``, ``<｜DSML｜ invoke name="N">``, ``</｜DSML｜ parameter>``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

from tito.parse.base import make_call
from tito.parse.tagged import Call, TaggedParser, extract_blocks, json_object

_V31_BLOCK = re.compile(r"<｜tool▁calls▁begin｜>(.*?)<｜tool▁calls▁end｜>", re.DOTALL)
_V31_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>",
                       re.DOTALL)
DSML = "｜DSML｜"


@lru_cache(maxsize=8)
def _dsml_patterns(tag: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(invoke, parameter) patterns for DSML tags spelled ``<{tag}invoke ...>``."""
    tag = re.escape(tag)
    invoke = re.compile(rf'<{tag}invoke name="([^"]+)">\n?(.*?)</{tag}invoke>\n?', re.DOTALL)
    param = re.compile(rf'<{tag}parameter name="([^"]+)" string="(true|false)">(.*?)'
                       rf"</{tag}parameter>\n?", re.DOTALL)
    return invoke, param


def _v31(match: re.Match[str]) -> list[Call] | None:
    body = match.group(1)
    calls: list[Call] = []
    for call in _V31_CALL.finditer(body):
        args = json_object(call.group(2))
        if args is None or not call.group(1).strip():
            return None
        calls.append(make_call(call.group(1).strip(), args))
    if not calls or _V31_CALL.sub("", body).strip():
        return None
    return calls


def _dsml(match: re.Match[str], tag: str = DSML) -> list[Call] | None:
    invokes, params = _dsml_patterns(tag)
    body = match.group(1)
    calls: list[Call] = []
    for invoke in invokes.finditer(body):
        args: dict[str, Any] = {}
        for param in params.finditer(invoke.group(2)):
            value = param.group(3)
            if param.group(2) == "false":
                try:
                    value = json.loads(value)
                except ValueError:
                    return None
            args[param.group(1)] = value
        if params.sub("", invoke.group(2)).strip():
            return None
        calls.append(make_call(invoke.group(1), args))
    if not calls or invokes.sub("", body).strip():
        return None
    return calls


@dataclass
class DeepSeekV31Parser(TaggedParser):
    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        return extract_blocks(text, _V31_BLOCK, _v31)


@dataclass
class DsmlParser(TaggedParser):
    block: str = "tool_calls"
    """``function_calls`` (V3.2), ``tool_calls`` (V4) or ``calls`` (V4.1)."""
    tag_space: str = ""
    """What follows the DSML token in every tag: ``" "`` in V4.1, nothing before."""

    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        tag = DSML + self.tag_space
        opened = re.escape(tag + self.block)
        pattern = re.compile(rf"\n*<{opened}>\n?(.*?)</{opened}>", re.DOTALL)
        return extract_blocks(text, pattern, partial(_dsml, tag=tag))
