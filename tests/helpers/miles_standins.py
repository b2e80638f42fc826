"""Stand-ins for the reference framework's rollout types, written from its field lists
(``miles/utils/types.py`` ``Sample``, ``miles/rollout/base_types.py``
``GenerateFnInput``/``GenerateFnOutput`` at 31f1ca96), and agents in its contract for
the ``tito.integrations.miles`` tests (loaded by their dotted paths, as the framework
loads ``--custom-agent-function-path``).
"""

from __future__ import annotations

import asyncio
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import httpx
import numpy as np
import openai

from helpers.scripted import WEATHER_TOOLS, weather_agent


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: np.ndarray | None = None
    rollout_indexer_topk: np.ndarray | None = None
    remove_sample: bool = False

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    non_generation_time: float = 0.0

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def to_dict(self) -> dict[str, int]:
            return {"cached_tokens": self.cached_tokens,
                    "total_prompt_tokens": self.total_prompt_tokens}

        @staticmethod
        def from_dict(data: dict[str, int]) -> Sample.PrefixCacheInfo:
            return Sample.PrefixCacheInfo(data.get("cached_tokens", 0),
                                          data.get("total_prompt_tokens", 0))

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    @dataclass
    class SpecInfo:
        """Its speculative counters at 31f1ca96 (older names)."""

        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

    spec_info: SpecInfo = field(default_factory=SpecInfo)


@dataclass
class GenerateState:
    args: Namespace


@dataclass(frozen=True)
class GenerateFnInput:
    state: GenerateState
    sample: Sample
    sampling_params: dict[str, Any]
    evaluation: bool

    @property
    def args(self) -> Namespace:
        return self.state.args


# -- agents in the framework's contract -------------------------------------------------
calls: list[dict[str, Any]] = []
"""What the agents saw (base_url, prompt, request_kwargs, metadata), in call order."""
aborts: list[Any] = []
"""The ``args`` each call of :func:`abort` received."""
after_turn: list[Callable[[], None]] = []
"""Called (in order) by :func:`one_turn_then_raise` after its turn."""


def _client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def _record(base_url: str, prompt: Any, request_kwargs: dict[str, Any],
            metadata: dict[str, Any]) -> None:
    calls.append({"base_url": base_url, "prompt": prompt, "request_kwargs": request_kwargs,
                  "metadata": metadata})


async def weather(base_url: str, prompt: list[dict[str, Any]], request_kwargs: dict[str, Any],
                  metadata: dict[str, Any], **_: Any) -> dict[str, Any]:
    """The scripted weather conversation (nine requests, retries included)."""
    _record(base_url, prompt, request_kwargs, metadata)
    async with _client(base_url) as client:
        async def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
            reply = await client.chat.completions.create(
                model="m", messages=messages, tools=WEATHER_TOOLS, **request_kwargs)
            return reply.choices[0].message.model_dump(exclude_none=True)

        await weather_agent(chat, 1)
    return {"answer_checked": True, "agent_metrics": {"total_tool_time": 0.25}}


async def one_turn_then_raise(base_url: str, prompt: list[dict[str, Any]],
                              request_kwargs: dict[str, Any], metadata: dict[str, Any],
                              **_: Any) -> dict[str, Any]:
    _record(base_url, prompt, request_kwargs, metadata)
    async with _client(base_url) as client:
        await client.chat.completions.create(model="m", messages=prompt, **request_kwargs)
    for hook in after_turn:
        hook()
    raise RuntimeError("the tool sandbox crashed")


async def silent(base_url: str, prompt: list[dict[str, Any]], request_kwargs: dict[str, Any],
                 metadata: dict[str, Any], **_: Any) -> None:
    """Makes no model call."""
    _record(base_url, prompt, request_kwargs, metadata)


async def delete_own_session(base_url: str, prompt: list[dict[str, Any]],
                             request_kwargs: dict[str, Any], metadata: dict[str, Any],
                             **_: Any) -> None:
    """Deletes its session, so that the collection gets an error reply (410)."""
    _record(base_url, prompt, request_kwargs, metadata)
    async with httpx.AsyncClient() as http:
        (await http.delete(base_url)).raise_for_status()


async def one_turn_then_hang(base_url: str, prompt: list[dict[str, Any]],
                             request_kwargs: dict[str, Any], metadata: dict[str, Any],
                             **_: Any) -> None:
    _record(base_url, prompt, request_kwargs, metadata)
    async with _client(base_url) as client:
        await client.chat.completions.create(model="m", messages=prompt, **request_kwargs)
    await asyncio.Event().wait()


async def abort(args: Any) -> None:
    """The module's abort hook (the framework calls it with its ``args``)."""
    await asyncio.sleep(0)
    aborts.append(args)


@dataclass(frozen=True)
class AgentResult:
    """The framework's newer instrumented-harness result (its
    ``miles.rollout.agentic.harness.AgentResult`` fields)."""

    metadata: dict[str, Any] | None
    producer_finished: bool


async def _instrumented(base_url: str, prompt: list[dict[str, Any]],
                        request_kwargs: dict[str, Any], finished: bool) -> AgentResult:
    """Registers its context, calls the model with its identity headers (as the
    framework's ``AgentRun`` / ``GenerationRequest`` do), returns an AgentResult."""
    context = {"agent_run_id": "main", "context_id": "main-1"}
    async with httpx.AsyncClient(timeout=30) as http:
        (await http.post(f"{base_url}/contexts", json=context)).raise_for_status()
    headers = {"X-Miles-Agent-Run-Id": "main", "X-Miles-Context-Id": "main-1",
               "X-Miles-Idempotency-Key": "first"}
    async with _client(base_url) as client:
        await client.chat.completions.create(model="m", messages=prompt, extra_headers=headers,
                                             **request_kwargs)
    return AgentResult({"reward": 1.0, "harness": "instrumented"}, finished)


async def instrumented(base_url: str, prompt: list[dict[str, Any]],
                       request_kwargs: dict[str, Any], metadata: dict[str, Any],
                       **_: Any) -> AgentResult:
    _record(base_url, prompt, request_kwargs, metadata)
    return await _instrumented(base_url, prompt, request_kwargs, True)


async def instrumented_unfinished(base_url: str, prompt: list[dict[str, Any]],
                                  request_kwargs: dict[str, Any], metadata: dict[str, Any],
                                  **_: Any) -> AgentResult:
    """Its child work's completion is unknown: ``producer_finished=False``."""
    _record(base_url, prompt, request_kwargs, metadata)
    return await _instrumented(base_url, prompt, request_kwargs, False)
