"""smolagents against the gateway: ``ToolCallingAgent`` and ``CodeAgent`` over
``OpenAIServerModel`` (Chat Completions).

smolagents ends a run with its ``final_answer`` tool, so its script differs in form from
the other harnesses' (same shape: a reasoning turn, a tool round trip, three model calls):
the tool's result asks for ``final_answer``, and a second run (``reset=False``, the same
memory) answers the follow-up with ``final_answer`` at once. The CodeAgent's replies are
code blocks (``SAY`` lines); its local Python executor runs only the tool and
``final_answer``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.harness import DUMMY_KEY, MODEL, HarnessStack, Trajectory, cells, errors_total

pytest.importorskip("smolagents")
from smolagents import (
    ActionStep,
    CodeAgent,
    OpenAIServerModel,
    ToolCallingAgent,
    tool,
)

pytestmark = pytest.mark.slow

THOUGHT = "THINK The user wants the weather: call the tool."


def _final(answer: str, code: bool) -> str:
    """The directive of a reply that gives ``answer`` with ``final_answer``."""
    if code:
        return f"SAY Thought: done.\nSAY <code>\nSAY final_answer({answer!r})\nSAY </code>"
    return "CALL final_answer " + json.dumps({"answer": answer})


def weather_tool(code: bool) -> Any:
    """The ``get_weather`` tool; its result scripts a CodeAgent's reply when ``code``."""

    @tool
    def get_weather(city: str) -> str:
        """Current weather of a city.

        Args:
            city: the city's name.
        """
        return f"sunny, 21 C in {city}\n{_final(f'It is sunny in {city}.', code)}"

    return get_weather


REWRITES_HISTORY = (
    "smolagents rebuilds the history from its memory as text: the turn-1 reply (tool call "
    "+ reasoning_content) is replayed as an assistant message with content 'Calling "
    "tools:\\n[{...python repr of the call...}]' and no tool_calls nor reasoning_content, "
    "the tool result as a user message 'Observation:\\n...'; on request 2 of "
    "/v1/chat/completions the strict matcher finds message 2 differs and v1 rolls turn 1 "
    "back, and likewise turn 2 on request 3: records 1, num_turns 1 of 3")
REWRITES_CODE = (
    "smolagents' CodeAgent replays each reply (content = code block) without its "
    "reasoning_content and with '\\nCalling tools:\\n[{...python_interpreter call...}]' "
    "appended to its content, and the tool output as a user message "
    "'Observation:\\nExecution logs:...'; on request 2 of /v1/chat/completions the strict "
    "matcher finds message 2 differs and v1 rolls turn 1 back, and likewise turn 2 on "
    "request 3: records 1, num_turns 1 of 3")
VARIANTS = ("tool-calling", "code")


def run_smolagents(traj: Trajectory, variant: str) -> int:
    """The conversation; returns the model calls (action steps) in the agent's memory."""
    code = variant == "code"
    model = OpenAIServerModel(model_id=MODEL, api_base=traj.openai_base_url, api_key=DUMMY_KEY,
                              client_kwargs={"max_retries": 0})
    agent: Any
    if code:
        agent = CodeAgent(tools=[weather_tool(code)], model=model, max_steps=4, verbosity_level=0)
        task = (f"{THOUGHT}\nSAY Thought: call the tool.\nSAY <code>\n"
                "SAY print(get_weather('Paris'))\nSAY </code>")
    else:
        agent = ToolCallingAgent(tools=[weather_tool(code)], model=model, max_steps=4,
                                 verbosity_level=0)
        task = f'{THOUGHT}\nCALL get_weather {{"city": "Paris"}}'
    assert agent.run(task) == "It is sunny in Paris."
    assert agent.run(_final("Goodbye.", code), reset=False) == "Goodbye."
    steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
    assert all(s.error is None for s in steps), [s.error for s in steps]
    return len(steps)


@pytest.mark.parametrize(("variant", "version"), cells({}, VARIANTS, ("v2",)))
def test_every_call_is_in_the_samples(harness: HarnessStack, variant: str,
                                      version: str) -> None:
    traj = Trajectory(harness, version)
    traj.check(run_smolagents(traj, variant))


@pytest.mark.parametrize("variant", VARIANTS)
def test_v1_tells_the_client_that_it_rewrote_the_history(harness: HarnessStack,
                                                         variant: str) -> None:
    """smolagents rebuilds each request as text (see REWRITES_HISTORY, REWRITES_CODE): v1
    would discard the previous call at every request, so the gateway refuses it with 400
    ``history_rewritten`` (naming v2) instead of losing turns silently; the call it
    answered stays in the session."""
    traj = Trajectory(harness, "v1")
    before = errors_total(traj.gateway, "history_rewritten")
    with pytest.raises(Exception):  # noqa: B017 - smolagents wraps the 400 its own way
        run_smolagents(traj, variant)
    assert errors_total(traj.gateway, "history_rewritten") > before
    assert traj.info()["page"]["total"] == 1 and traj.engine_calls() == 1
