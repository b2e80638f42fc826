"""Hermes-style completions (Qwen3, our ChatML tool template).

Format: an optional ``<think>...</think>`` block, then text, then zero or more
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks. A block whose JSON
is malformed (or that is cut by ``length``) stays in ``content``: never dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tito.parse.base import api_finish_reason, call_arguments, ids_through, make_call
from tito.types.messages import ParsedCompletion
from tito.types.tokenizer import Tokenizer

_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _parse_call(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = call_arguments(obj.get("arguments", {}))
    return None if args is None else make_call(obj["name"], args)


def split_reasoning(text: str, *, opened: bool = False) -> tuple[str | None, str]:
    """Split ``<think>R</think>C`` into (R, C). ``opened``: the prompt already opened the block."""
    if "</think>" in text:
        head, _, tail = text.partition("</think>")
        if "<think>" in head:
            head = head.split("<think>", 1)[1]
        return head.strip("\n"), tail.lstrip("\n")
    if text.lstrip().startswith("<think>"):  # cut inside the reasoning block
        return text.split("<think>", 1)[1].lstrip("\n"), ""
    if opened:
        return text.strip("\n"), ""
    return None, text


@dataclass
class HermesParser:
    tokenizer: Tokenizer
    think_opened_by_prompt: bool = False

    def parse(self, output_ids: Sequence[int], engine_finish: str) -> ParsedCompletion:
        text = self.tokenizer.decode(output_ids, skip_special_tokens=True)
        reasoning, rest = split_reasoning(text, opened=self.think_opened_by_prompt)
        calls: list[dict[str, Any]] = []
        kept: list[str] = []
        pos = 0
        for match in _CALL_RE.finditer(rest):
            call = _parse_call(match.group(1))
            if call is None:
                continue  # malformed: stays in content
            kept.append(rest[pos : match.start()])
            pos = match.end()
            calls.append(call)
        kept.append(rest[pos:])
        content = "".join(kept).strip() if calls else rest.strip()
        return ParsedCompletion(
            content=content if (content or not calls) else None,
            reasoning_content=reasoning,
            tool_calls=calls,
            finish_reason=api_finish_reason(engine_finish, bool(calls)),
            decoded=(output_ids, len(output_ids), text),
        )

    def reasoning_tokens(self, output_ids: Sequence[int], parsed: ParsedCompletion) -> int:
        """The ids of ``parsed``'s reasoning: up to and including ``</think>`` (all of them
        when the completion was cut inside the block)."""
        if parsed.reasoning_content is None:
            return 0
        decoded = parsed.decoded
        text = decoded[2] if decoded is not None and decoded[0] is output_ids and \
            decoded[1] == len(output_ids) else None
        end = ids_through(self.tokenizer, output_ids, "</think>", skip_special_tokens=True,
                          text=text)
        return len(output_ids) if end is None else end
