"""Streaming text deltas out of a completion that is still being generated (design §7).

Every family parser works on whole completions. While ids arrive, :class:`DeltaStream`
parses the ids so far as a cut completion and sends only the part of the reasoning and
the content that cannot change any more:

* text from the first tool-call marker on (any family's: ``<tool_call>``, ``[TOOL_CALLS]``
  ...) is held back, and so is a trailing piece that could be the start of a marker or of
  the reasoning's closing tag;
* a trailing U+FFFD (a multi-byte character cut between two tokens) is held back, and so
  is trailing whitespace (the final parse strips it at the end);
* special tokens decode whole (one id each), so they are never split.

Tool calls are sent as soon as the cut completion parses with them whole (a call's
closing marker arrived), each once: the caller gives the parses stable call ids
(:func:`tito.parse.base.stable_call_ids`), so these are the ids the committed message
carries. When the turn is committed, :meth:`DeltaStream.finish` gives the rest of the
reasoning, the content and the calls from the final parse; the deltas then add up to
exactly the committed message. Should the final parse disagree with what was sent (a cut
completion read differently from the whole, which the holdback makes rare), the field's
remainder is not sent and :attr:`DeltaStream.diverged` says which field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tito.types.messages import ParsedCompletion

CALL_MARKERS: tuple[str, ...] = (
    "<tool_call>", "<|tool_call|>", "<tool_calls>", "<function=", "<|python_tag|>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>", "[TOOL_CALLS]", "<minimax:tool_call>", "<|start|>",
    "<|channel|>", "<|constrain|>", "<|call|>", '{"name"', "<think>", "</think>",
    "]<]minimax[>[", "<mm:think>", "</mm:think>",
    "<|tool_call>", "<|channel>", "<channel|>",
    "<|close|>",  # Kimi K3: closes the response section (then tools)
    "<|open|>",  # Kimi K3: opens a section
    "<｜DSML｜",  # DeepSeek V3.2 / V4 / V4.1 (``<｜DSML｜ calls>``)
    "<|message_model|>",  # Inkling: a model message not yet readable (a call's name)
)
"""Texts that may begin a tool call (or a section a parser reads specially) in some
family; content is held back from the first one on."""
REASONING_MARKERS: tuple[str, ...] = (
    "</think>", "<|end|>", "<|channel|>", "<|start|>",
    "</mm:think>", "<channel|>",
    "<|close|>",  # Kimi K3: <|close|>think<|sep|>
)
"""Texts that may close a reasoning block."""

Parse = Callable[[Sequence[int], str], ParsedCompletion]


@dataclass(slots=True)
class Delta:
    reasoning: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Tool calls complete since the last delta (OpenAI shape, final ids)."""
    first_call: int = 0
    """The index of ``calls[0]`` among the message's tool calls."""
    has_reasoning: bool = False
    """Whether the message, as parsed so far, has ``reasoning_content`` (even empty): a
    stream that lists the reasoning as an item of its own opens it before the text and the
    calls that follow it, also when it is empty."""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


@dataclass(slots=True)
class DeltaStream:
    parse: Parse
    every: int = 1
    """Parse again once this many new ids arrived (or a 16th of the ids so far)."""
    reasoning: str = ""
    """Reasoning text sent so far."""
    content: str = ""
    """Content text sent so far."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Tool calls sent so far."""
    diverged: list[str] = field(default_factory=list)
    _parsed_at: int = 0

    def update(self, ids: Sequence[int]) -> Delta:
        """The new stable text after ``ids`` (the output so far)."""
        if len(ids) - self._parsed_at < max(self.every, self._parsed_at // 16) and \
                self._parsed_at:
            return Delta()
        self._parsed_at = len(ids)
        parsed = self.parse(ids, "length")
        first = len(self.calls)
        new_calls = []
        if parsed.tool_calls[:first] == self.calls:
            new_calls = parsed.tool_calls[first:]
            self.calls += new_calls
        return Delta(self._advance("reasoning", _stable(parsed.reasoning_content or "",
                                                         REASONING_MARKERS)),
                     self._advance("content", _stable(parsed.content or "", CALL_MARKERS)),
                     new_calls, first, parsed.reasoning_content is not None)

    def finish(self, parsed: ParsedCompletion) -> Delta:
        """The rest of the committed message's reasoning, content and tool calls."""
        first = len(self.calls)
        rest: list[dict[str, Any]] = []
        if parsed.tool_calls[:first] == self.calls:
            rest = parsed.tool_calls[first:]
            self.calls += rest
        else:
            self.diverged.append("tool_calls")
        return Delta(self._rest("reasoning", parsed.reasoning_content or ""),
                     self._rest("content", parsed.content or ""), rest, first,
                     parsed.reasoning_content is not None)

    def _advance(self, name: str, stable: str) -> str:
        sent: str = getattr(self, name)
        if len(stable) <= len(sent) or not stable.startswith(sent):
            return ""
        setattr(self, name, stable)
        return stable[len(sent):]

    def _rest(self, name: str, final: str) -> str:
        sent: str = getattr(self, name)
        if not final.startswith(sent):
            self.diverged.append(name)
            return ""
        setattr(self, name, final)
        return final[len(sent):]


def _stable(text: str, markers: tuple[str, ...]) -> str:
    """``text`` up to the first marker, without a trailing marker prefix or U+FFFD."""
    cut = len(text)
    for marker in markers:
        at = text.find(marker)
        if at != -1:
            cut = min(cut, at)
    text = text[:cut]
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:n]):
                text = text[:-n]
                break
    return text.rstrip(" \t\r\n\ufffd")  # whitespace too: a final parse strips it
