"""A small in-process engine for fast tests of the gateway (never of the engines).

:class:`FakeEngine` implements the engine protocol (:class:`tito.types.engine.Engine`):
each ``generate`` answers the next scripted reply — an assistant message, rendered to the
ids a model of the family would emit (:meth:`TemplateRenderer.render_completion`), or an
exception to raise. ``gate`` holds generations until it is set, to test concurrency.
The wire format of a real engine is tested elsewhere (the mock engine, SGLang client).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tito.render.base import TemplateRenderer
from tito.types.engine import (
    EngineStats,
    GenerateResult,
    PauseMode,
    ReplayRequest,
    SamplingParams,
)


@dataclass
class Call:
    input_ids: list[int]
    params: SamplingParams
    rid: str


class FakeEngine:
    name = "fake"

    def __init__(self, renderer: TemplateRenderer, *, context: int | None = None) -> None:
        self.renderer = renderer
        self.context = context
        self.replies: deque[dict[str, Any] | BaseException] = deque()
        self.calls: list[Call] = []
        self.gate: asyncio.Event | None = None
        self.aborted: list[str] = []
        self.closed = False
        self.weight_version = "w0"
        self.replays: list[ReplayRequest | None] = []
        self.down: str | None = None
        """A reason makes probe()/health() report the engine down."""
        self.stale_retries = 0
        """Reported by stats() (an HTTP client's resent requests)."""

    def script(self, *replies: str | dict[str, Any] | BaseException) -> FakeEngine:
        """Queue replies: a string is an assistant message with that content."""
        for reply in replies:
            self.replies.append({"role": "assistant", "content": reply}
                                if isinstance(reply, str) else reply)
        return self

    async def generate(self, input_ids: Sequence[int] | np.ndarray, params: SamplingParams,
                       rid: str, *, replay: ReplayRequest | None = None) -> GenerateResult:
        self.calls.append(Call([int(i) for i in input_ids], params, rid))
        self.replays.append(replay)
        if self.gate is not None:
            await self.gate.wait()
        reply = self.replies.popleft() if self.replies else \
            {"role": "assistant", "content": "ok"}
        if isinstance(reply, BaseException):
            raise reply
        ids = self.renderer.render_completion(reply)
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        return GenerateResult(output_ids=ids, logprobs=[-0.25] * len(ids),
                              finish_reason=finish,  # type: ignore[arg-type]
                              prompt_tokens=len(input_ids), weight_version=self.weight_version)

    async def abort(self, rid: str) -> None:
        self.aborted.append(rid)

    async def context_length(self) -> int | None:
        return self.context

    async def pause(self, mode: PauseMode = "retract") -> None:
        pass

    async def resume(self) -> None:
        pass

    async def update_weight_version(self, version: str) -> None:
        self.weight_version = version

    async def health(self) -> bool:
        return self.down is None

    async def probe(self) -> str | None:
        return self.down

    def stats(self) -> EngineStats:
        return EngineStats(self.name, stale_retries=self.stale_retries)

    async def close(self) -> None:
        self.closed = True


class ModelEngine(FakeEngine):
    """The mock engine's scripted model (:class:`tito.engines.mock.directives.MockModel`)
    in this process: replies follow the prompt's directives (``CALL``, ``SAY``, ``LONG``),
    deterministically per prompt, so concurrent agents get their own replies in any
    interleaving. (The wire format is the mock server's business, tested elsewhere.)"""

    name = "model"

    def __init__(self, renderer: TemplateRenderer, *, context: int | None = None) -> None:
        from tito.engines.mock.directives import MockModel

        super().__init__(renderer, context=context)
        self.model = MockModel(renderer)

    async def generate(self, input_ids: Sequence[int] | np.ndarray, params: SamplingParams,
                       rid: str, *, replay: ReplayRequest | None = None) -> GenerateResult:
        ids = [int(i) for i in input_ids]
        self.calls.append(Call(ids, params, rid))
        if self.gate is not None:
            await self.gate.wait()
        if self.replies:  # a scripted failure (or reply) still comes first
            reply = self.replies.popleft()
            if isinstance(reply, BaseException):
                raise reply
        from tito.engines.mock.directives import prompt_digest

        plan = self.model.plan(ids, max_new_tokens=params.max_new_tokens)
        finish = "length" if plan.finish_reason["type"] == "length" else "stop"
        return GenerateResult(output_ids=plan.output_ids, logprobs=plan.logprobs,
                              finish_reason=finish,  # type: ignore[arg-type]
                              prompt_tokens=len(ids),
                              weight_version=f"w{prompt_digest(ids).hex()[:6]}")
