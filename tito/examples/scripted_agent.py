"""A deterministic agent for ``tito rollout --engine mock`` (CI, tests, demos without a model).

It scripts the mock engine (:mod:`tito.engines.mock.directives`): before each request it
appends one directive line to the message it is about to send (the prompt's last user
message, a tool result, or its feedback turn). The default script solves a question of
the bundled dataset in two turns::

    turn 1: CALL calculator {"expression": metadata["expression"]}   -> a tool call
    turn 2: SAY <the tool's result>                                   -> the answer

and later turns say ``metadata["answer"]``. ``metadata["script"]`` (a list of directive
strings, one per turn) replaces it. A ``context_length_exceeded`` refusal ends the
episode. Test knobs in the metadata: ``fail`` (raise
``RuntimeError`` before the first request), ``sleep`` (seconds to wait first; :func:`abort`
cancels the wait). Returns ``{"reward": 0.0 or 1.0, "turns": n, "tool_calls": n}``.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from openai import AsyncOpenAI, BadRequestError

from tito.examples.calculator import (
    CALCULATOR_TOOL,
    extract_number,
    format_number,
    is_correct,
    run_calculator,
)
from tito.examples.calculator_agent import (
    FEEDBACK,
    context_exceeded,
    function_call,
    sdk_messages,
    split_request_kwargs,
)

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageToolCallUnion

_WAITING: set[asyncio.Future[None]] = set()


def abort() -> None:
    """Cancel the ``sleep`` waits in progress (the driver calls this on Ctrl-C)."""
    for wait in list(_WAITING):
        wait.cancel()


async def _sleep(seconds: float) -> None:
    wait = asyncio.ensure_future(asyncio.sleep(seconds))
    _WAITING.add(wait)
    try:
        await wait
    finally:
        _WAITING.discard(wait)


def default_script(metadata: dict[str, Any]) -> list[str]:
    """``CALL calculator`` with the reference expression, then ``SAY`` the result."""
    answer = metadata.get("answer")
    expression = str(metadata.get("expression") or format_number(answer or 0))
    result = run_calculator({"expression": expression})
    return [f"CALL calculator {json.dumps({'expression': expression})}", f"SAY {result}"]


def _tool_result(call: ChatCompletionMessageToolCallUnion) -> dict[str, Any]:
    """The calculator's answer to ``call``, whatever function it names."""
    call = function_call(call)
    return {"role": "tool", "tool_call_id": call.id,
            "content": run_calculator(call.function.arguments)}


def _append(message: dict[str, Any], directive: str) -> dict[str, Any]:
    return {**message, "content": f"{message.get('content') or ''}\n{directive}"}


async def run_agent(base_url: str, prompt: list[dict[str, Any]],
                    request_kwargs: dict[str, Any], metadata: dict[str, Any],
                    **kw: Any) -> dict[str, Any]:
    """Run the script against the mock engine; reward 1.0 when the last answer is right."""
    if metadata.get("fail"):
        raise RuntimeError(f"scripted failure (prompt {metadata.get('prompt_index')})")
    if metadata.get("sleep"):
        await _sleep(float(metadata["sleep"]))
    max_turns = int(kw.get("max_turns") or metadata.get("max_turns") or 2)
    script = list(metadata.get("script") or default_script(metadata))
    reference = metadata.get("answer")
    kwargs = split_request_kwargs(request_kwargs)
    messages = [dict(m) for m in prompt]
    turns = tool_calls = 0
    correct = False
    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="tito", max_retries=0) as client:
        while turns < max_turns:
            directive = script[turns] if turns < len(script) else f"SAY {reference}"
            messages[-1] = _append(messages[-1], directive)
            try:
                completion = await client.chat.completions.create(
                    model="tito", messages=sdk_messages(messages), tools=[CALCULATOR_TOOL],
                    **kwargs)
            except BadRequestError as exc:  # over --max-seq-len: end the episode
                if not context_exceeded(exc):
                    raise
                break
            turns += 1
            choice = completion.choices[0]
            messages.append(choice.message.model_dump(exclude_none=True))
            if choice.message.tool_calls and choice.finish_reason != "length":
                tool_calls += len(choice.message.tool_calls)
                messages.extend(_tool_result(call) for call in choice.message.tool_calls)
                continue
            correct = is_correct(extract_number(choice.message.content), reference)
            if correct and turns >= 2:
                break
            messages.append({"role": "user", "content": FEEDBACK})
    return {"reward": 1.0 if correct else 0.0, "turns": turns, "tool_calls": tool_calls}
