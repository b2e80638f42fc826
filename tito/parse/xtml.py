"""Kimi K3 "XTML" completions.

The generation prompt opens ``<|open|>think<|sep|>`` (thinking on) or
``<|open|>response<|sep|>`` (off); the model then emits::

    R<|close|>think<|sep|><|open|>response<|sep|>C<|close|>response<|sep|>
    <|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
    <|open|>argument key="K" type="string"<|sep|>V<|close|>argument<|sep|>…
    <|close|>call<|sep|>…<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>

(one line here; no newlines in the format). Typed arguments: ``string`` values are raw, the
others JSON; a call may carry one ``<|open|>json type="object"<|sep|>{…}<|close|>json<|sep|>``
instead. Attribute values escape ``&`` and ``"``. The template renders reasoning and content
unstripped, so both are kept exactly. Calls carry no ids (new ones are made). Text that does
not parse stays in ``content``, verbatim.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tito.parse.base import api_finish_reason, ids_through, make_call
from tito.parse.tagged import Call, TaggedParser, json_object
from tito.types.messages import ParsedCompletion

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
THINK_END = f"{CLOSE}think{SEP}"
RESPONSE_START = f"{OPEN}response{SEP}"
RESPONSE_END = f"{CLOSE}response{SEP}"
TOOLS_START, TOOLS_END = f"{OPEN}tools{SEP}", f"{CLOSE}tools{SEP}"
MESSAGE_END = f"{CLOSE}message{SEP}"
_O, _C, _S = (re.escape(t) for t in (OPEN, CLOSE, SEP))
_CALL = re.compile(rf'{_O}call tool="([^"]*)" index="\d+"{_S}(.*?){_C}call{_S}', re.DOTALL)
_ARG = re.compile(rf'{_O}argument key="([^"]*)" type="(\w+)"{_S}(.*?){_C}argument{_S}',
                  re.DOTALL)
_JSON = re.compile(rf'{_O}json type="object"{_S}(.*?){_C}json{_S}', re.DOTALL)
_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "number": (int, float), "boolean": bool, "null": type(None),
    "object": dict, "array": list}


def _unescape(value: str) -> str:
    return value.replace("&quot;", '"').replace("&amp;", "&")


def _argument(kind: str, raw: str) -> tuple[bool, Any]:
    """(ok, value) of one typed argument."""
    if kind == "string":
        return True, raw
    try:
        value = json.loads(raw)
    except ValueError:
        return False, None
    expected = _TYPES.get(kind)
    ok = expected is not None and isinstance(value, expected) and \
        (kind == "boolean" or not isinstance(value, bool))
    return ok, value


def _arguments(body: str) -> dict[str, Any] | None:
    """The arguments of one call body, or None when it does not parse whole."""
    whole = _JSON.fullmatch(body)
    if whole is not None:
        return json_object(whole.group(1))
    args: dict[str, Any] = {}
    pos = 0
    for match in _ARG.finditer(body):
        if match.start() != pos:
            return None
        ok, value = _argument(match.group(2), match.group(3))
        if not ok:
            return None
        args[_unescape(match.group(1))] = value
        pos = match.end()
    return args if pos == len(body) else None


def _calls(tail: str) -> tuple[list[Call], str]:
    """The calls of the tools section at the start of ``tail`` and the text they (with the
    section's and the message's closing tags) do not account for: the section's opener and
    what follows its last call that parses, when the section does not close after it."""
    calls: list[Call] = []
    pos = 0
    if tail.startswith(TOOLS_START):
        pos = len(TOOLS_START)
        while (match := _CALL.match(tail, pos)) is not None:
            args = _arguments(match.group(2))
            if args is None:
                break
            calls.append(make_call(_unescape(match.group(1)), args))
            pos = match.end()
        if not tail.startswith(TOOLS_END, pos):  # cut, or a call that does not parse
            return calls, TOOLS_START + tail[pos:]
        pos += len(TOOLS_END)
    if tail.startswith(MESSAGE_END, pos):
        pos += len(MESSAGE_END)
    return calls, tail[pos:]


@dataclass
class XtmlParser(TaggedParser):
    think_start: str | None = None
    think_end: str | None = THINK_END

    def split_reasoning(self, text: str, engine_finish: str = "stop") -> tuple[str | None, str]:
        """(reasoning, rest): a completed answer in thinking mode always closes the think
        section; a text that closes the response without it came from a thinking-off
        prompt; a cut text with neither is reasoning (thinking is on by default)."""
        if THINK_END in text:
            head, _, tail = text.partition(THINK_END)
            return head, tail
        if engine_finish != "stop" and RESPONSE_END not in text:
            return text, ""
        return None, text

    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        """(content, calls) of the text after the think section."""
        body = text[len(RESPONSE_START):] if text.startswith(RESPONSE_START) else text
        content, found, tail = body.partition(RESPONSE_END)
        if not found:
            return content, []
        calls, rest = _calls(tail)
        if rest:  # never dropped: what does not parse stays in content, verbatim
            return content + RESPONSE_END + rest, calls
        return content, calls

    def reasoning_tokens(self, output_ids: Sequence[int], parsed: ParsedCompletion) -> int:
        if parsed.reasoning_content is None:
            return 0
        end = ids_through(self.tokenizer, output_ids, THINK_END)
        return len(output_ids) if end is None else end

    def parse(self, output_ids: Sequence[int], engine_finish: str) -> ParsedCompletion:
        reasoning, rest = self.split_reasoning(self.text_of(output_ids), engine_finish)
        content, calls = self.extract_calls(rest)
        return ParsedCompletion(
            content=content if (content or not calls) else None,
            reasoning_content=reasoning,
            tool_calls=calls,
            finish_reason=api_finish_reason(engine_finish, bool(calls)),
        )
