"""The demo agent of ``tito rollout``: a multi-turn math agent with a calculator tool.

It follows the agent contract (design §7)::

    async def run_agent(base_url, prompt, request_kwargs, metadata, **kw) -> dict

and talks to the gateway with the official ``openai`` SDK on ``base_url + "/v1"``. Each
turn offers the ``calculator`` tool. When the model calls it, the agent executes the call
(:func:`tito.examples.calculator.run_calculator`, a safe ``ast`` evaluator) and sends the
result back as a ``tool`` message. Otherwise it reads the last number of the reply and
verifies it against ``metadata["answer"]``:

- wrong, missing or cut off (``finish_reason == "length"``): verifier feedback as a user
  turn, :data:`FEEDBACK`;
- right on the first turn: it asks for confirmation once (:data:`CONFIRM`), so every
  trajectory has at least two turns whatever the model says (given ``max_turns >= 2``);
- right on a later turn: it stops.

It stops after ``max_turns`` turns (keyword argument, else ``metadata["max_turns"]``,
else :data:`DEFAULT_MAX_TURNS`), or when the gateway answers ``context_length_exceeded``
(the conversation no longer fits ``--max-seq-len``: the episode ends, what was generated
is kept) or ``truncated_generation`` (a gateway run with ``--after-length-cut refuse``
does not extend a reply cut by the token limit: the episode ends at the cut). It returns
``{"reward": r, "turns": n, "tool_calls": n, "answer": last number or None,
"mentioned_answer": bool, "finish_reasons": [...], "stopped": "answered" | "max_turns" |
"context_length_exceeded" | "truncated_generation"}``, which the driver merges into the
sample metadata. The reward gives partial credit, so a 135M model earns some: **1.0**
when the last answer is right, **0.5** when a reply of the episode (a cut one included)
named the right number but the last answer is wrong, missing or cut off, else **0.0**.

:func:`abort` is the optional hook of the contract: the driver calls it on Ctrl-C, and it
cancels every model request this module has in flight.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from openai import AsyncOpenAI, BadRequestError, ConflictError
from openai.types.chat import ChatCompletion, ChatCompletionMessageToolCall

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionMessageToolCallUnion

from tito.examples.calculator import (
    CALCULATOR_TOOL,
    extract_number,
    is_correct,
    mentions,
    run_calculator,
)

SYSTEM_PROMPT = (
    "You are a careful math assistant. You can use the calculator tool for arithmetic. "
    "Give the final answer as just the number."
)
FEEDBACK = "Check your answer and reply with just the number."
CONFIRM = "Are you sure? Check your answer and reply with just the number."
DEFAULT_MAX_TURNS = 3
PARTIAL_CREDIT = 0.5
"""The reward of an episode whose replies named the right number but whose last answer
is not it."""
MODEL = "tito"
# Sampling settings the SDK has no named argument for travel in the request body.
_SDK_ARGS = frozenset({"max_tokens", "temperature", "top_p", "stop", "seed",
                       "presence_penalty", "frequency_penalty"})

_IN_FLIGHT: set[asyncio.Future[ChatCompletion]] = set()


def abort() -> None:
    """Cancel every model request in flight (the driver calls this on Ctrl-C)."""
    for request in list(_IN_FLIGHT):
        request.cancel()


@dataclass
class Episode:
    """What happened in one trajectory; :meth:`result` is what ``run_agent`` returns."""

    turns: int = 0
    tool_calls: int = 0
    answer: float | None = None
    correct: bool = False
    mentioned: bool = False
    """A reply named the right number (partial credit)."""
    finish_reasons: list[str] = field(default_factory=list)
    stopped: str = "max_turns"

    @property
    def reward(self) -> float:
        return 1.0 if self.correct else PARTIAL_CREDIT if self.mentioned else 0.0

    def result(self) -> dict[str, Any]:
        return {"reward": self.reward, "turns": self.turns,
                "tool_calls": self.tool_calls, "answer": self.answer,
                "mentioned_answer": self.mentioned,
                "finish_reasons": self.finish_reasons, "stopped": self.stopped}


def context_exceeded(exc: BadRequestError) -> bool:
    """Whether the gateway refused the turn because the conversation is too long."""
    return exc.code == "context_length_exceeded"


def split_request_kwargs(request_kwargs: dict[str, Any]) -> dict[str, Any]:
    """SDK keyword arguments: the standard names directly, the rest in ``extra_body``."""
    direct = {k: v for k, v in request_kwargs.items() if k in _SDK_ARGS}
    extra = {k: v for k, v in request_kwargs.items() if k not in _SDK_ARGS}
    return {**direct, "extra_body": extra} if extra else direct


def with_system_prompt(prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The dataset prompt, with :data:`SYSTEM_PROMPT` first unless it has a system turn."""
    messages = [dict(m) for m in prompt]
    if not messages or messages[0].get("role") not in ("system", "developer"):
        messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
    return messages


def function_call(call: ChatCompletionMessageToolCallUnion) -> ChatCompletionMessageToolCall:
    """``call`` as a function call; any other kind is a ValueError (only functions are offered)."""
    if call.type != "function":
        raise ValueError(f"unexpected {call.type!r} tool call {call.id!r}: only function tools "
                         "are offered")
    return call


def tool_result(call: ChatCompletionMessageToolCallUnion) -> dict[str, Any]:
    """The ``tool`` message answering one tool call."""
    call = function_call(call)
    if call.function.name == CALCULATOR_TOOL["function"]["name"]:
        content = run_calculator(call.function.arguments)
    else:
        content = f"error: unknown tool {call.function.name!r}"
    return {"role": "tool", "tool_call_id": call.id, "content": content}


def sdk_messages(messages: list[dict[str, Any]]) -> list[ChatCompletionMessageParam]:
    """The conversation as the SDK types it: its messages are OpenAI chat messages as JSON
    (the dataset prompt, dumped replies, tool results and user turns)."""
    return cast("list[ChatCompletionMessageParam]", messages)


async def _chat(client: AsyncOpenAI, messages: list[dict[str, Any]],
                kwargs: dict[str, Any]) -> ChatCompletion:
    request = asyncio.ensure_future(client.chat.completions.create(
        model=MODEL, messages=sdk_messages(messages), tools=[CALCULATOR_TOOL], **kwargs))
    _IN_FLIGHT.add(request)
    try:
        return await request
    finally:
        _IN_FLIGHT.discard(request)


async def run_agent(base_url: str, prompt: list[dict[str, Any]],
                    request_kwargs: dict[str, Any], metadata: dict[str, Any],
                    **kw: Any) -> dict[str, Any]:
    """Solve ``prompt`` in at most ``max_turns`` turns; see the module docstring."""
    max_turns = int(kw.get("max_turns") or metadata.get("max_turns") or DEFAULT_MAX_TURNS)
    reference = metadata.get("answer")
    kwargs = split_request_kwargs(request_kwargs)
    messages = with_system_prompt(prompt)
    episode = Episode()
    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="tito", max_retries=0) as client:
        while episode.turns < max_turns:
            try:
                completion = await _chat(client, messages, kwargs)
            except BadRequestError as exc:
                if not context_exceeded(exc):
                    raise
                episode.stopped = "context_length_exceeded"
                break
            except ConflictError as exc:
                if exc.code != "truncated_generation":
                    raise
                episode.stopped = "truncated_generation"  # --after-length-cut refuse
                break
            episode.turns += 1
            choice = completion.choices[0]
            message = choice.message
            episode.finish_reasons.append(choice.finish_reason)
            messages.append(message.model_dump(exclude_none=True))
            episode.mentioned = episode.mentioned or mentions(message.content, reference)
            if message.tool_calls and choice.finish_reason != "length":
                episode.tool_calls += len(message.tool_calls)
                messages.extend(tool_result(call) for call in message.tool_calls)
                continue
            truncated = choice.finish_reason == "length"
            episode.answer = None if truncated else extract_number(message.content)
            episode.correct = is_correct(episode.answer, reference)
            if episode.correct and episode.turns >= 2:
                episode.stopped = "answered"
                break
            messages.append({"role": "user", "content": CONFIRM if episode.correct
                             else FEEDBACK})
    return episode.result()
