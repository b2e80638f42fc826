"""The demo agent (``tito.examples``): the calculator tool, the bundled data, and the agent
itself over a real gateway + mock engine (the mock is scripted by directives in the
prompt: ``SAY``, ``CALL``, ``LONG``)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from tito.client.agent import generate
from tito.client.tracer import SessionTracer
from tito.examples import ARITHMETIC_DATA
from tito.examples import calculator_agent as demo
from tito.examples.calculator import (
    CalculatorError,
    evaluate,
    extract_number,
    extract_numbers,
    format_number,
    is_correct,
    mentions,
    run_calculator,
)

pytestmark = pytest.mark.slow  # a real demo agent per case


# -- the calculator tool -----------------------------------------------------------------
@pytest.mark.parametrize(("expression", "value"), [
    ("17 * 23", 391), ("(8 + 4) * 5", 60), ("2 ** 10", 1024), ("2 ^ 10", 1024),
    ("7 - 12", -5), ("-3 + +4", 1), ("81 / 9", 9.0), ("7 // 2", 3), ("7 % 4", 3),
    ("3.5 + 2.25", 5.75), ("sqrt(169)", 13.0), ("abs(-2) + max(1, 5) + min(3, 4)", 10),
    ("round(2.567, 2)", 2.57), ("1,234 + 1", 1235), ("6 × 7 ÷ 2", 21.0),
])
def test_evaluate(expression: str, value: float) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(("expression", "message"), [
    ("__import__('os').system('true')", "not allowed"),
    ("open('/etc/passwd')", "not allowed"),
    ("(1).__class__", "not allowed"),
    ("x + 1", "not allowed"),
    ("lambda: 1", "not allowed"),
    ("[1, 2]", "not allowed"),
    ("'a' * 3", "only numbers"),
    ("True + 1", "only numbers"),
    ("9 ** 999999", "exponents are limited"),
    ("10 ** 60 * 10 ** 60", "too large"),
    ("1 / 0", "division by zero"),
    ("sqrt(-1)", "sqrt"),
    ("1 +", "not an arithmetic expression"),
    ("", "empty"),
    ("1+" * 200 + "1", "longer than"),
])
def test_evaluate_rejects(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError, match=message):
        evaluate(expression)


def test_run_calculator_reports_errors_as_text() -> None:
    assert run_calculator('{"expression": "12 * 3"}') == "36"
    assert run_calculator({"expression": "1 / 4"}) == "0.25"
    assert run_calculator('{"expression": "81 / 9"}') == "9"
    assert run_calculator("not json") == "error: the arguments are not valid JSON"
    assert run_calculator("{}") == 'error: missing "expression"'
    assert run_calculator('{"expression": "1/0"}') == "error: division by zero"


def test_numbers_and_verification() -> None:
    assert extract_number("The answer is 1,234.5.") == 1234.5
    assert extract_number("It is -5, I think") == -5
    assert extract_number("first 3 then 4") == 4
    assert extract_number("Mock reply 7f3a9b12.") is None  # digits inside a hex word
    assert extract_number(None) is None and extract_number("no digits") is None
    assert is_correct(391.0, 391) and is_correct(5.75, 5.75) and not is_correct(390, 391)
    assert not is_correct(None, 4) and not is_correct(4, None)
    assert format_number(9.0) == "9" and format_number(0.1 + 0.2) == "0.3"
    assert extract_numbers("7 + 5 = 12, not 1,300.5") == [7, 5, 12, 1300.5]
    assert mentions("7 + 5 = 12. Final: 13", 12) and not mentions("7 + 5 = 13", 12)
    assert not mentions(None, 12) and not mentions("12", None)


def test_bundled_dataset() -> None:
    lines = ARITHMETIC_DATA.read_text().splitlines()
    assert len(lines) == 32
    kinds = set()
    for line in lines:
        record = json.loads(line)
        assert record["messages"][-1]["role"] == "user"
        meta = record["metadata"]
        kinds.add(meta["kind"])
        assert isinstance(meta["answer"], int | float)
        assert math.isclose(evaluate(meta["expression"]), meta["answer"])
    assert kinds == {"arithmetic", "unit_conversion"}


# -- the agent over a real gateway ---------------------------------------------------------
async def run_demo(gateway_url: str, question: str, *, answer: float = 4,
                   max_turns: int = 3) -> Any:
    prompt = [{"role": "user", "content": question}]
    async with SessionTracer(gateway_url) as tracer:
        [sample] = await generate(demo.run_agent, prompt, {"max_new_tokens": 64},
                                  tracer=tracer, metadata={"answer": answer},
                                  max_turns=max_turns)
    return sample


async def test_right_first_answer_is_confirmed(qwen3_stack: Any) -> None:
    sample = await run_demo(qwen3_stack[1].url, "What is 2 + 2?\nSAY 4", max_turns=2)
    meta = sample.metadata
    assert meta["turns"] == meta["num_turns"] == 2  # asked to confirm a right answer
    assert demo.CONFIRM in sample.response
    assert meta["finish_reasons"] == ["stop", "stop"]
    assert sample.status == "completed"
    # the mock's second reply is not a number: partial credit for having named the answer
    assert sample.reward == demo.PARTIAL_CREDIT and meta["mentioned_answer"]


async def test_tool_call_is_executed(qwen3_stack: Any) -> None:
    sample = await run_demo(qwen3_stack[1].url,
                            'What is 2 + 2?\nCALL calculator {"expression": "2 + 2"}')
    meta = sample.metadata
    assert meta["tool_calls"] == 1 and meta["finish_reasons"][0] == "tool_calls"
    assert "<tool_response>\n4\n</tool_response>" in sample.response
    assert meta["turns"] == meta["num_turns"] == 3
    assert demo.FEEDBACK in sample.response  # the mock's reply after the tool is no number


async def test_cut_off_reply_gets_feedback(qwen3_stack: Any) -> None:
    sample = await run_demo(qwen3_stack[1].url, "What is 2 + 2?\nSAY 4\nLONG 3", max_turns=2)
    meta = sample.metadata
    assert meta["finish_reasons"] == ["length", "stop"]
    assert meta["turns"] == meta["num_turns"] == 2  # the gateway recorded both turns
    assert meta["answer"] is None  # a cut-off reply is never read as an answer
    assert len(meta["lifecycle"]) == 2  # both turns are in the sample (design §5.6)
    assert [c["turn"] for c in meta["length_cut_turns"]] == [0]
    assert sample.status == "completed"  # the last turn's
    assert all(m["type"] == "assistant_text" for m in meta["tito_session_mismatch"])


async def test_wrong_answers_run_to_max_turns(qwen3_stack: Any) -> None:
    sample = await run_demo(qwen3_stack[1].url, "What is 2 + 2?\nSAY 5", max_turns=3)
    assert sample.metadata["turns"] == sample.metadata["num_turns"] == 3
    assert sample.metadata["answer"] is None and sample.reward == 0.0
    assert not sample.metadata["mentioned_answer"]


async def test_abort_cancels_requests_in_flight() -> None:
    """A gateway that never answers: ``abort()`` ends the agent's pending request."""
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        await asyncio.sleep(3600)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        agent = asyncio.create_task(demo.run_agent(
            f"http://127.0.0.1:{port}/sessions/x", [{"role": "user", "content": "1+1?"}],
            {"max_tokens": 8}, {"answer": 2}))
        for _ in range(500):
            if demo._IN_FLIGHT:
                break
            await asyncio.sleep(0.01)
        assert demo._IN_FLIGHT, "the agent never sent its request"
        demo.abort()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(agent, 10)
        assert not demo._IN_FLIGHT
    finally:
        server.close()
