"""Inkling completions: one assistant message is several model messages.

After the ``<|message_model|>`` generation prompt the model writes model messages, each
``KIND BODY <|end_message|>`` and the next opened by ``<|message_model|>``, then stops at
``<|content_model_end_sampling|>``:

- ``<|content_thinking|>R`` -> reasoning;
- ``<|content_text|>C`` -> content;
- ``NAME<|content_invoke_tool_json|>{"name":NAME,"args":{...}}`` -> a tool call (one message
  per call: parallel calls are several messages).

Several reasoning or text messages are joined with ``\\n``. Bodies are kept exactly (not
stripped): the template writes them verbatim, so a message the template rendered parses back
to itself. A model message the parser cannot read (an unknown kind, a call whose JSON is not
``{"name": NAME, "args": {...}}``) stays in ``content`` verbatim with its opener.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from tito.parse.base import api_finish_reason, make_call
from tito.parse.tagged import Call, TaggedParser, json_object
from tito.types.messages import ParsedCompletion

MODEL = "<|message_model|>"
END = "<|end_message|>"
THINKING = "<|content_thinking|>"
TEXT = "<|content_text|>"
INVOKE = "<|content_invoke_tool_json|>"
STOP = "<|content_model_end_sampling|>"


def _call(header: str, payload: str) -> Call | None:
    """The call of a ``NAME<|content_invoke_tool_json|>JSON`` message (None: malformed)."""
    value = json_object(payload)
    if value is None or value.get("name") != header or not isinstance(value.get("args"), dict):
        return None
    return make_call(header, value["args"])


@dataclass
class InklingParser(TaggedParser):
    think_start: str | None = None
    think_end: str | None = None

    def parse(self, output_ids: Sequence[int], engine_finish: str) -> ParsedCompletion:
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[Call] = []
        for segment in self.text_of(output_ids).split(MODEL):
            if not segment:
                continue  # an opener just generated: its message has not begun
            body = segment[: -len(END)] if segment.endswith(END) else segment
            header, sep, payload = body.partition(INVOKE)
            call = _call(header, payload) if sep else None
            if body.startswith(THINKING):
                reasoning.append(body[len(THINKING):])
            elif body.startswith(TEXT):
                content.append(body[len(TEXT):])
            elif call is not None:
                calls.append(call)
            else:
                content.append(MODEL + segment)  # unreadable: verbatim, with its opener
        text = "\n".join(content)
        return ParsedCompletion(
            content=text if (text or not calls) else None,
            reasoning_content="\n".join(reasoning) if reasoning else None,
            tool_calls=calls,
            finish_reason=api_finish_reason(engine_finish, bool(calls)),
        )

    def reasoning_tokens(self, output_ids: Sequence[int], parsed: ParsedCompletion) -> int:
        """The ids of the thinking messages (each through its ``<|end_message|>``; the
        first one's opener is the prompt's)."""
        ids = list(output_ids)
        opener = self.tokenizer.token_to_id(MODEL)
        cuts = [0, *(i for i, t in enumerate(ids) if t == opener and i), len(ids)]
        return sum(b - a for a, b in pairwise(cuts)
                   if self.tokenizer.decode(ids[a:b], skip_special_tokens=False)
                   .removeprefix(MODEL).startswith(THINKING))
