"""Turning completion ids back into an assistant message (design §4.5)."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from typing import Any

from tito.types.messages import ParsedCompletion
from tito.types.tokenizer import Tokenizer

__all__ = ["api_finish_reason", "call_arguments", "ids_through", "make_call", "new_call_id",
           "stable_call_ids"]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def stable_call_ids(parsed: ParsedCompletion, key: str) -> ParsedCompletion:
    """``parsed`` with tool-call ids derived from ``key`` (the response id) and each call's
    position: a completion parsed while it streams and parsed whole gives its calls the
    same ids, so a call can be sent as soon as it is complete."""
    for i, call in enumerate(parsed.tool_calls):
        call["id"] = "call_" + hashlib.sha256(f"{key}/{i}".encode()).hexdigest()[:24]
    return parsed


def make_call(name: str, arguments: dict[str, Any], call_id: str | None = None
              ) -> dict[str, Any]:
    """An OpenAI tool call; ``arguments`` serialized as a JSON string."""
    return {"id": call_id or new_call_id(), "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def call_arguments(value: Any) -> dict[str, Any] | None:
    """Tool-call arguments as an object (given as one or as a JSON string), else None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def api_finish_reason(engine_finish: str, has_tool_calls: bool) -> str:
    """``tool_calls`` only when calls were parsed and the generation stopped normally."""
    if engine_finish == "length":
        return "length"
    if engine_finish == "abort":
        return "abort"
    return "tool_calls" if has_tool_calls else "stop"


def ids_through(tokenizer: Tokenizer, output_ids: Sequence[int], marker: str, *,
                skip_special_tokens: bool = False, text: str | None = None) -> int | None:
    """How many of ``output_ids`` it takes for their text to hold ``marker``: the ids up to
    and including the one that completes its first occurrence (None: the text of all of
    them does not hold it). A marker that is one token is found by its id; one spelled
    out in pieces by a binary search over decoded prefixes (a few decodes). ``text``: the
    text of all of ``output_ids`` (decoded with the same ``skip_special_tokens``), when
    the caller has it: :func:`_only_occurrence` may then spare the decodes."""
    ids = list(output_ids)

    def holds(n: int) -> bool:
        return marker in tokenizer.decode(ids[:n], skip_special_tokens=skip_special_tokens)

    marker_id = tokenizer.token_to_id(marker)
    try:  # one scan: where the marker's id is, if anywhere
        high = -1 if marker_id is None else ids.index(marker_id)
    except ValueError:
        high = -1
    if high >= 0:
        if text is not None and _only_occurrence(tokenizer, marker, marker_id, text,
                                                 skip_special_tokens):
            return high + 1
        if not holds(high):
            return high + 1
    elif holds(len(ids)):
        high = len(ids)
    else:
        return None
    low = 0  # holds(low) is false, holds(high) true
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if holds(mid) else (mid, high)
    return high


def _only_occurrence(tokenizer: Tokenizer, marker: str, marker_id: int | None, text: str,
                     skip_special_tokens: bool) -> bool:
    """Whether the ids before the marker's first id cannot hold ``marker`` (then
    :func:`ids_through` is that id's position + 1), read from ``text``, the text of all
    the ids, instead of decoding them: true when ``text`` holds ``marker`` once and the
    decoder is byte-level (the fast decoder, checked equal to the original). Its text is
    the ids' bytes, joined, as UTF-8 with replacement characters, where an ASCII byte
    always stands for itself: an ASCII ``marker`` in the text of the ids before the
    marker's id would be a second occurrence in ``text``, besides the marker id's own
    (kept: its text is ``marker``, decoded with the same setting)."""
    return (marker_id is not None and tokenizer.fast_decode is not None
            and marker.isascii() and text.count(marker) == 1
            and tokenizer.decode([marker_id], skip_special_tokens=skip_special_tokens)
            == marker)
