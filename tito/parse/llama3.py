"""Llama 3.x completions: optional text, then JSON tool calls
``{"name": N, "parameters": {...}}`` (``arguments`` accepted too), several separated by ``;``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tito.parse.base import call_arguments, make_call
from tito.parse.tagged import Call, TaggedParser

_START = re.compile(r'\{\s*"name"\s*:')
_DECODER = json.JSONDecoder()


def _calls_from(text: str) -> list[Call] | None:
    calls: list[Call] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        try:
            obj, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = call_arguments(obj.get("parameters", obj.get("arguments", {})))
        if args is None:
            return None
        calls.append(make_call(obj["name"], args))
        rest = text[pos:].lstrip()
        if not rest:
            return calls
        if not rest.startswith(";"):
            return None
        pos = len(text) - len(rest) + 1


@dataclass
class Llama3JsonParser(TaggedParser):
    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        match = _START.search(text)
        if match is None:
            return text, []
        head = text[: match.start()]
        if head and not head.endswith("\n") and head.strip():
            return text, []  # JSON quoted inside prose: not a call
        calls = _calls_from(text[match.start():])
        if calls is None:
            return text, []
        return head, calls
