"""The agent contract (design §7): ``generate()`` with tiny agents against real processes.

The gateway (``tito serve``) and the mock engine (``tito mock-engine``) run as
subprocesses (the ``qwen3_stack`` fixture); the agents use the real ``openai`` SDK.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from tito.client.agent import generate
from tito.client.tracer import SessionTracer

pytestmark = pytest.mark.slow  # real gateway and mock processes (fast tier under a minute)

PROMPT = [{"role": "user", "content": "SAY hello there"}]


@pytest.fixture
def urls(qwen3_stack: Any) -> tuple[str, str]:
    """(engine URL, gateway URL) with the mock's request log cleared."""
    engine, gateway = qwen3_stack
    httpx.delete(engine.url + "/mock/requests")
    return engine.url, gateway.url


async def one_turn(base_url: str, prompt: list[dict[str, Any]],
                   request_kwargs: dict[str, Any]) -> str:
    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0) as client:
        reply = await client.chat.completions.create(model="m", messages=prompt,
                                                     **request_kwargs)
    return reply.choices[0].message.content or ""


async def test_agent_dict_merged_and_reward_set(urls: tuple[str, str]) -> None:
    async def agent(base_url: str, prompt: list[dict[str, Any]],
                    request_kwargs: dict[str, Any], metadata: dict[str, Any],
                    **kw: Any) -> dict[str, Any]:
        text = await one_turn(base_url, prompt, request_kwargs)
        return {"reward": 0.5, "said": text, "turns": 1}

    async with SessionTracer(urls[1]) as tracer:
        samples = await generate(agent, PROMPT, {"max_new_tokens": 32}, tracer=tracer,
                                 metadata={"id": "q1", "answer": 4})
    assert len(samples) == 1
    sample = samples[0]
    assert sample.status == "completed"
    assert sample.reward == 0.5
    meta = sample.metadata
    assert meta["id"] == "q1" and meta["answer"] == 4  # the caller's metadata
    assert meta["said"] == "hello there" and meta["turns"] == 1  # the agent's dict
    assert meta["num_turns"] == 1 and len(meta["session_id"]) == 32  # the gateway's
    assert sample.response_length == len(sample.loss_mask) > 0


async def test_request_kwargs_in_openai_names(urls: tuple[str, str]) -> None:
    seen: dict[str, Any] = {}

    async def agent(base_url: str, prompt: list[dict[str, Any]],
                    request_kwargs: dict[str, Any], metadata: dict[str, Any],
                    **kw: Any) -> None:
        seen.update(request_kwargs=request_kwargs, metadata=metadata, kw=kw,
                    base_url=base_url)
        await one_turn(base_url, prompt, request_kwargs)

    async with SessionTracer(urls[1]) as tracer:
        await generate(agent, PROMPT,
                       {"max_new_tokens": 7, "temperature": 0.5, "sampling_seed": 3},
                       tracer=tracer, metadata={"id": "q2"}, max_seq_len=4096, max_turns=5)
    assert seen["request_kwargs"] == {"max_tokens": 7, "temperature": 0.5, "seed": 3}
    assert seen["metadata"] == {"id": "q2", "max_seq_len": 4096}
    assert seen["kw"] == {"max_turns": 5}
    assert seen["base_url"].startswith(urls[1] + "/sessions/")
    [entry] = httpx.get(urls[0] + "/mock/requests").json()
    params = entry["sampling_params"]
    assert params["max_new_tokens"] == 7 and params["temperature"] == 0.5
    assert params["sampling_seed"] == 3


def test_unknown_sampling_setting_is_rejected() -> None:
    from tito.client.agent import to_request_kwargs

    assert to_request_kwargs({"max_new_tokens": 3, "top_k": None}) == {"max_tokens": 3}
    with pytest.raises(ValueError, match="unknown sampling setting 'beam_width'"):
        to_request_kwargs({"beam_width": 4})


def test_resolve_agent_forms_and_errors(tmp_path: Path) -> None:
    """``--agent``: module:function or a file, never module.function unless asked; errors
    are one-line RolloutInputErrors (a ConfigError and a ValueError) naming the flag."""
    from tito.client.agent import resolve_agent
    from tito.client.errors import RolloutInputError
    from tito.examples import scripted_agent
    from tito.types.errors import ConfigError

    fn, _ = resolve_agent("tito.examples.scripted_agent:run_agent")
    assert fn is scripted_agent.run_agent
    assert resolve_agent("tito.examples.scripted_agent.run_agent",
                         dotted=True)[0] is scripted_agent.run_agent
    agent = tmp_path / "file_agent.py"
    agent.write_text("async def run_agent(*args, **kw):\n    return None\n\n"
                     "def abort():\n    pass\n")
    fn, abort = resolve_agent(f"{agent}:run_agent")
    assert fn.__module__ == "_tito_file_file_agent" and abort is not None
    with pytest.raises(RolloutInputError) as info:
        resolve_agent("tito.examples.scripted_agent.run_agent", flag="--my-agent")
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
    assert str(info.value) == ("--my-agent 'tito.examples.scripted_agent.run_agent' must look "
                               "like module:function or path/to/file.py:function")


async def test_agent_exception_propagates_and_session_is_deleted(
        urls: tuple[str, str]) -> None:
    bases: list[str] = []

    async def agent(base_url: str, prompt: list[dict[str, Any]],
                    request_kwargs: dict[str, Any], metadata: dict[str, Any],
                    **kw: Any) -> None:
        bases.append(base_url)
        await one_turn(base_url, prompt, request_kwargs)
        raise ValueError("the agent broke")

    async with SessionTracer(urls[1]) as tracer:
        with pytest.raises(ValueError, match="the agent broke"):
            await generate(agent, PROMPT, {"max_new_tokens": 16}, tracer=tracer)
    assert httpx.get(bases[0]).status_code == 410  # deleted


async def test_non_dict_result_is_a_type_error(urls: tuple[str, str]) -> None:
    bases: list[str] = []

    async def agent(base_url: str, *args: Any, **kw: Any) -> Any:
        bases.append(base_url)
        return ["not", "a", "dict"]

    async with SessionTracer(urls[1]) as tracer:
        with pytest.raises(TypeError, match="must return a dict or None"):
            await generate(agent, PROMPT, None, tracer=tracer)
    assert httpx.get(bases[0]).status_code == 410  # deleted


async def test_zero_turn_agent_gives_aborted_sample_with_empty_reason(
        urls: tuple[str, str]) -> None:
    bases: list[str] = []

    async def agent(base_url: str, *args: Any, **kw: Any) -> dict[str, Any]:
        bases.append(base_url)
        return {"reward": 0.0}

    async with SessionTracer(urls[1]) as tracer:
        [sample] = await generate(agent, PROMPT, None, tracer=tracer, metadata={"id": "q3"})
    assert sample.status == "aborted"
    assert sample.metadata["aborted_reason"] == "empty: no_records"
    assert sample.metadata["id"] == "q3" and sample.metadata["num_turns"] == 0
    assert sample.response_length == 0 and len(sample.tokens) == 0
    assert sample.reward == 0.0
    assert httpx.get(bases[0]).status_code == 410  # deleted


async def test_last_turn_cut_by_length_is_no_strict_mismatch(urls: tuple[str, str]) -> None:
    async def agent(base_url: str, prompt: list[dict[str, Any]],
                    request_kwargs: dict[str, Any], metadata: dict[str, Any],
                    **kw: Any) -> None:
        await one_turn(base_url, [{"role": "user", "content": "SAY hi\nLONG 3"}],
                       request_kwargs)

    async with SessionTracer(urls[1]) as tracer:
        [sample] = await generate(agent, PROMPT, {"max_new_tokens": 32}, tracer=tracer)
    assert sample.status == "truncated"
    strict = [m for m in sample.metadata["tito_session_mismatch"]
              if m["type"] != "assistant_text"]
    assert strict == []


async def test_collect_timeout_gives_aborted_sample(urls: tuple[str, str]) -> None:
    gateway = urls[1]
    async with SessionTracer(gateway) as tracer:
        session = await tracer.create()
        await one_turn(session.base_url, PROMPT, {"max_tokens": 16})
        impatient = SessionTracer(gateway, timeout=1e-9)
        try:
            decoded = await impatient.collect(session)
        finally:
            await impatient.aclose()
            await tracer.delete(session)  # the impatient DELETE timed out as well
    [sample] = decoded.samples
    assert sample.status == "aborted"
    assert sample.metadata["aborted_reason"].startswith("collect failed")
    assert httpx.get(session.base_url).status_code == 410  # deleted
