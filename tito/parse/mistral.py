"""Mistral (Tekken) completions: text, then ``[TOOL_CALLS][{"name", "arguments", "id"}, ...]``.

Mistral requires tool-call ids of 9 alphanumerics: a model-emitted valid id is kept, any
other call gets a fresh one.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

from tito.parse.base import call_arguments, make_call
from tito.parse.tagged import Call, TaggedParser

_ALPHABET = string.ascii_letters + string.digits
_VALID_ID = re.compile(r"^[A-Za-z0-9]{9}$")
_DECODER = json.JSONDecoder()


def mistral_call_id() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(9))


def _calls(body: str) -> tuple[list[Call], str] | None:
    try:
        items, end = _DECODER.raw_decode(body.lstrip())
    except ValueError:
        return None
    if not isinstance(items, list) or not items:
        return None
    calls: list[Call] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        args = call_arguments(item.get("arguments", {}))
        if args is None:
            return None
        cid = item.get("id")
        cid = cid if isinstance(cid, str) and _VALID_ID.match(cid) else mistral_call_id()
        calls.append(make_call(item["name"], args, call_id=cid))
    return calls, body.lstrip()[end:]


@dataclass
class MistralParser(TaggedParser):
    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        head, sep, body = text.partition("[TOOL_CALLS]")
        if not sep:
            return text, []
        parsed = _calls(body)
        if parsed is None or parsed[1].strip():
            return text, []
        return head, parsed[0]
