"""Kimi K2 completions: ``<think>R</think>`` then a
``<|tool_calls_section_begin|>`` section of
``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>JSON<|tool_call_end|>``.
The model-emitted call id (``functions.NAME:IDX``) is kept verbatim as the OpenAI id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tito.parse.base import make_call
from tito.parse.tagged import Call, TaggedParser, extract_blocks, json_object

_SECTION = re.compile(r"<\|tool_calls_section_begin\|>(.*?)<\|tool_calls_section_end\|>",
                      re.DOTALL)
_CALL = re.compile(r"<\|tool_call_begin\|>\s*(.*?)\s*<\|tool_call_argument_begin\|>(.*?)"
                   r"<\|tool_call_end\|>", re.DOTALL)
_ID = re.compile(r"^(?:functions\.)?([\w\-.]+?)(?::\d+)?$")


def _convert(match: re.Match[str]) -> list[Call] | None:
    body = match.group(1)
    calls: list[Call] = []
    for call in _CALL.finditer(body):
        call_id = call.group(1)
        name = _ID.match(call_id)
        args = json_object(call.group(2))
        if name is None or args is None:
            return None
        calls.append(make_call(name.group(1), args, call_id=call_id))
    if not calls or _CALL.sub("", body).strip():
        return None
    return calls


@dataclass
class KimiParser(TaggedParser):
    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        return extract_blocks(text, _SECTION, _convert)
