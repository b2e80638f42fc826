"""DeepSeek completions.

- V3.1: ``<｜tool▁calls▁begin｜>(<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>JSON<｜tool▁call▁end｜>)+
  <｜tool▁calls▁end｜>``.
- V3.2 / V4 (DSML): ``<｜DSML｜function_calls>`` (V3.2) or ``<｜DSML｜tool_calls>`` (V4) holding
  ``<｜DSML｜invoke name="N">`` with ``<｜DSML｜parameter name="K" string="true|false">V`` items;
  ``string="false"`` values are JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tito.parse.base import make_call
from tito.parse.tagged import Call, TaggedParser, extract_blocks, json_object

_V31_BLOCK = re.compile(r"<｜tool▁calls▁begin｜>(.*?)<｜tool▁calls▁end｜>", re.DOTALL)
_V31_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>",
                       re.DOTALL)
DSML = "｜DSML｜"
_INVOKE = re.compile(rf'<{DSML}invoke name="([^"]+)">\n?(.*?)</{DSML}invoke>\n?', re.DOTALL)
_PARAM = re.compile(rf'<{DSML}parameter name="([^"]+)" string="(true|false)">(.*?)'
                    rf"</{DSML}parameter>\n?", re.DOTALL)


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


def _dsml(match: re.Match[str]) -> list[Call] | None:
    body = match.group(1)
    calls: list[Call] = []
    for invoke in _INVOKE.finditer(body):
        args: dict[str, Any] = {}
        for param in _PARAM.finditer(invoke.group(2)):
            value = param.group(3)
            if param.group(2) == "false":
                try:
                    value = json.loads(value)
                except ValueError:
                    return None
            args[param.group(1)] = value
        if _PARAM.sub("", invoke.group(2)).strip():
            return None
        calls.append(make_call(invoke.group(1), args))
    if not calls or _INVOKE.sub("", body).strip():
        return None
    return calls


@dataclass
class DeepSeekV31Parser(TaggedParser):
    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        return extract_blocks(text, _V31_BLOCK, _v31)


@dataclass
class DsmlParser(TaggedParser):
    block: str = "tool_calls"
    """``function_calls`` (V3.2) or ``tool_calls`` (V4)."""

    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        pattern = re.compile(rf"\n*<{DSML}{self.block}>\n?(.*?)</{DSML}{self.block}>",
                             re.DOTALL)
        return extract_blocks(text, pattern, _dsml)
