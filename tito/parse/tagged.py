"""A base for completion parsers: reasoning markers, tool-call extraction, finish reasons.

Family parsers subclass :class:`TaggedParser` and implement :meth:`extract_calls` on the
text after the reasoning block. Text is decoded with special tokens kept (many formats use
special tokens as markers), then the trailing stop token is removed. A tool call that does
not parse stays in ``content``, verbatim: never dropped (design §4.5).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tito.parse.base import api_finish_reason, ids_through
from tito.types.messages import ParsedCompletion
from tito.types.tokenizer import Tokenizer

Call = dict[str, Any]
_NUMBER = re.compile(r"^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?$")


def coerce_value(raw: str) -> Any:
    """A parameter value from XML-ish formats: JSON when it is JSON, else the string."""
    text = raw.strip()
    if text[:1] in '{["' or text in ("true", "false", "null") or _NUMBER.match(text):
        try:
            return json.loads(text)
        except ValueError:
            return raw
    return raw


def json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass
class TaggedParser:
    tokenizer: Tokenizer
    stop_texts: tuple[str, ...] = ()
    think_start: str | None = "<think>"
    think_end: str | None = "</think>"
    think_opened_by_prompt: bool = False
    strip_texts: tuple[str, ...] = field(default_factory=tuple)
    """Other marker texts removed from the decoded completion (e.g. a BOS)."""
    exact_reasoning: bool = False
    """Keep a closed reasoning block's text exactly (templates that render it unstripped);
    default: strip its leading and trailing newlines."""

    def text_of(self, output_ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(output_ids, skip_special_tokens=False)
        for stop in sorted(self.stop_texts, key=len, reverse=True):
            if stop and text.endswith(stop):
                text = text[: -len(stop)]
                break
        for marker in self.strip_texts:
            text = text.replace(marker, "")
        return text

    def split_reasoning(self, text: str, engine_finish: str = "stop") -> tuple[str | None, str]:
        """(reasoning, rest). With the block opened by the prompt and never closed, the text
        is reasoning only when the generation was cut (``length``/``abort``): a completed
        answer in thinking mode always closes the block, so a completed text without the
        closing tag came from a thinking-off prompt (which closed the block itself)."""
        start, end = self.think_start, self.think_end
        if end is None:
            return None, text
        if end in text:
            head, _, tail = text.partition(end)
            if start and start in head:
                head = head.split(start, 1)[1]
            elif not self.think_opened_by_prompt and head.strip():
                return None, text  # a stray closing tag: not ours to interpret
            return (head if self.exact_reasoning else head.strip("\n")), tail.lstrip("\n")
        if start and text.lstrip().startswith(start):  # cut inside the reasoning block
            return text.split(start, 1)[1].lstrip("\n"), ""
        if self.think_opened_by_prompt and engine_finish != "stop":
            return text.strip("\n"), ""
        return None, text

    def extract_calls(self, text: str) -> tuple[str, list[Call]]:
        """(content, calls) of the text after reasoning; unparsed calls stay in content."""
        return text, []

    def reasoning_tokens(self, output_ids: Sequence[int], parsed: ParsedCompletion) -> int:
        """The ids of ``parsed``'s reasoning: up to and including the block's closing tag
        (all of them when the completion was cut inside the block)."""
        if parsed.reasoning_content is None or self.think_end is None:
            return 0
        end = ids_through(self.tokenizer, output_ids, self.think_end)
        return len(output_ids) if end is None else end

    def parse(self, output_ids: Sequence[int], engine_finish: str) -> ParsedCompletion:
        text = self.text_of(output_ids)
        reasoning, rest = self.split_reasoning(text, engine_finish)
        content, calls = self.extract_calls(rest)
        content = content.strip()
        return ParsedCompletion(
            content=content if (content or not calls) else None,
            reasoning_content=reasoning,
            tool_calls=calls,
            finish_reason=api_finish_reason(engine_finish, bool(calls)),
        )


def extract_blocks(text: str, pattern: Any, convert: Any) -> tuple[str, list[Call]]:
    """Replace every ``pattern`` match that ``convert`` turns into a call list; keep others."""
    calls: list[Call] = []
    kept: list[str] = []
    pos = 0
    for match in pattern.finditer(text):
        converted = convert(match)
        if converted is None:
            continue  # malformed: stays in content
        kept.append(text[pos : match.start()])
        pos = match.end()
        calls.extend(converted)
    kept.append(text[pos:])
    return "".join(kept), calls
