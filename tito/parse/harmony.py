"""gpt-oss (harmony) completions, after the ``<|start|>assistant`` generation prompt.

A completion is one or more messages: ``<|channel|>analysis<|message|>R<|end|>``,
``<|start|>assistant<|channel|>final<|message|>C`` (stop ``<|return|>``), or a call
``<|start|>assistant to=functions.N<|channel|>commentary json<|message|>{...}`` (stop
``<|call|>``). analysis -> reasoning, final/commentary -> content, ``to=functions.N`` -> a
tool call (a body that is not a JSON object stays in content).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from tito.parse.base import api_finish_reason, make_call
from tito.parse.tagged import Call, TaggedParser, json_object
from tito.types.messages import ParsedCompletion

_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_ENDS = ("<|end|>", "<|call|>", "<|return|>")


@dataclass
class HarmonyParser(TaggedParser):
    def parse(self, output_ids: Sequence[int], engine_finish: str) -> ParsedCompletion:
        text = self.tokenizer.decode(list(output_ids), skip_special_tokens=False)
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[Call] = []
        for segment in text.split("<|start|>assistant"):
            if not segment:
                continue
            header, sep, body = segment.partition("<|message|>")
            for end in _ENDS:
                if body.endswith(end):
                    body = body[: -len(end)]
                    break
            if not sep:
                content.append(segment)  # no message body: keep the raw text
                continue
            channel = header.split("<|channel|>", 1)[1].split()[0] if "<|channel|>" in header \
                else ""
            recipient = _RECIPIENT.search(header)
            if recipient is not None:
                args = json_object(body)
                if args is None:
                    content.append(body)
                else:
                    calls.append(make_call(recipient.group(1), args))
            elif channel == "analysis":
                reasoning.append(body)
            else:
                content.append(body)
        text_content = "\n".join(c for c in content if c).strip()
        return ParsedCompletion(
            content=text_content if (text_content or not calls) else None,
            reasoning_content="\n".join(reasoning) if reasoning else None,
            tool_calls=calls,
            finish_reason=api_finish_reason(engine_finish, bool(calls)),
        )

    def reasoning_tokens(self, output_ids: Sequence[int], parsed: ParsedCompletion) -> int:
        """The ids of the ``analysis`` messages (each from its ``<|start|>`` through its
        ``<|end|>``; the first one's opener is the prompt's)."""
        ids = list(output_ids)
        start = self.tokenizer.token_to_id("<|start|>")
        cuts = [0, *(i for i, t in enumerate(ids) if t == start and i), len(ids)]
        return sum(b - a for a, b in pairwise(cuts)
                   if _analysis(self.tokenizer.decode(ids[a:b])))


def _analysis(segment: str) -> bool:
    """Whether a completion's message is reasoning (as :meth:`HarmonyParser.parse` reads it)."""
    header, sep, _ = segment.partition("<|message|>")
    if not sep or _RECIPIENT.search(header) or "<|channel|>" not in header:
        return False
    channel = header.split("<|channel|>", 1)[1].split()
    return bool(channel) and channel[0] == "analysis"
