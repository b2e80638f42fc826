"""The rollout driver behind ``tito rollout``: many agent trajectories against one gateway.

Pure asyncio + HTTP, no UI and no engine management (that is :mod:`tito.cli.rollout`).
:class:`RolloutDriver` runs ``n_per_prompt`` trajectories per prompt, ``concurrency`` at a
time, each in its own session (:func:`tito.client.agent.generate_with_metadata`). An agent
exception is recorded on its :class:`TrajectoryResult` and never touches the other
trajectories; a collect timeout gives the tracer's ABORTED sample.
:meth:`RolloutDriver.interrupt` (Ctrl-C) calls the agent module's ``abort()``, cancels every
running or waiting trajectory and deletes the sessions still open; what finished is kept.

The rest of a rollout lives next to it, one topic a module, and the names below are
importable from here too: the prompt set (:mod:`tito.client.prompts`, ``--data``), loading
the agent (:func:`tito.client.agent.resolve_agent`, ``--agent``), the settings
(:mod:`tito.client.settings`), the results (:mod:`tito.client.results`), the TITO checks
run on every sample (:mod:`tito.client.checks`) and the summary's numbers
(:mod:`tito.client.summary`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tito.client.agent import AbortFn, AgentFn, generate_with_metadata, resolve_agent
from tito.client.checks import sample_violations, strict_mismatches
from tito.client.errors import RolloutInputError
from tito.client.prompts import PromptItem, load_prompts
from tito.client.results import RolloutResult, TrajectoryResult
from tito.client.settings import RolloutSettings
from tito.client.summary import RolloutSummary, summarize
from tito.client.tracer import SessionTracer, TracedSession

__all__ = [
    "AbortFn",
    "PromptItem",
    "RolloutDriver",
    "RolloutInputError",
    "RolloutResult",
    "RolloutSettings",
    "RolloutSummary",
    "TrajectoryResult",
    "load_prompts",
    "resolve_agent",
    "run_trajectory",
    "sample_violations",
    "strict_mismatches",
    "summarize",
]

log = logging.getLogger("tito.rollout")


class _TrackingTracer(SessionTracer):
    """A tracer that remembers the sessions it has not deleted yet."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open_sessions: dict[str, TracedSession] = {}

    async def create(self, key: object = None, options: dict[str, Any] | None = None
                     ) -> TracedSession:
        session = await super().create(key, options)
        self.open_sessions[session.session_id] = session
        return session

    async def delete(self, session: TracedSession) -> None:
        await super().delete(session)  # a cancelled DELETE stays open: retried at exit
        self.open_sessions.pop(session.session_id, None)


class RolloutDriver:
    """Runs ``agent`` over ``prompts`` against the gateway at ``gateway_url`` (or the
    workers of ``tito serve --workers N``, a list in worker order: each trajectory's
    session is placed by a stable hash of its index)."""

    def __init__(self, gateway_url: str | list[str], agent: AgentFn, prompts: list[PromptItem],
                 settings: RolloutSettings, *, abort_hook: AbortFn | None = None,
                 on_result: Callable[[TrajectoryResult], None] | None = None) -> None:
        self.gateway_url = gateway_url
        self.agent = agent
        self.prompts = prompts
        self.settings = settings
        self.abort_hook = abort_hook
        self.on_result = on_result
        self._results: list[TrajectoryResult] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._interrupted = False
        self._abort_called = False
        self._pending_abort: Awaitable[Any] | None = None

    @property
    def total(self) -> int:
        return len(self.prompts) * self.settings.n_per_prompt

    def interrupt(self) -> None:
        """Stop: call the agent's ``abort()``, cancel all trajectories (idempotent)."""
        if self._interrupted:
            return
        self._interrupted = True
        if self.abort_hook is not None:
            self._abort_called = True
            try:
                outcome = self.abort_hook()
                if inspect.isawaitable(outcome):
                    self._pending_abort = outcome
            except Exception as exc:
                log.warning("the agent's abort() raised %s: %s", type(exc).__name__, exc)
        for task in self._tasks:
            task.cancel()

    async def run(self) -> RolloutResult:
        """Run every trajectory; returns when all finished or after :meth:`interrupt`."""
        start = time.monotonic()
        semaphore = asyncio.Semaphore(self.settings.concurrency)
        async with _TrackingTracer(self.gateway_url,
                                   timeout=self.settings.collect_timeout) as tracer:
            self._tasks = [
                asyncio.create_task(self._trajectory(tracer, semaphore, prompt, k),
                                    name=f"trajectory-{prompt.index}-{k}")
                for prompt in self.prompts for k in range(self.settings.n_per_prompt)
            ]
            if self._interrupted:  # interrupted before the tasks existed
                for task in self._tasks:
                    task.cancel()
            outcomes = await asyncio.gather(*self._tasks, return_exceptions=True)
            if self._pending_abort is not None:
                try:
                    await self._pending_abort
                except Exception as exc:
                    log.warning("the agent's abort() raised %s: %s", type(exc).__name__, exc)
            leftover = list(tracer.open_sessions.values())
            for session in leftover:
                await tracer.delete(session)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(
                    outcome, asyncio.CancelledError):
                log.error("trajectory task failed: %r", outcome)
        return RolloutResult(
            trajectories=list(self._results), requested=self.total,
            cancelled=self.total - len(self._results), interrupted=self._interrupted,
            abort_hook_called=self._abort_called, sessions_deleted_at_exit=len(leftover),
            wall_time=time.monotonic() - start,
        )

    async def _trajectory(self, tracer: SessionTracer, semaphore: asyncio.Semaphore,
                          prompt: PromptItem, k: int) -> None:
        async with semaphore:
            result = await run_trajectory(tracer, self.agent, prompt, k, self.settings)
            self._results.append(result)
            if self.on_result is not None:
                self.on_result(result)


async def run_trajectory(tracer: SessionTracer, agent: AgentFn, prompt: PromptItem, k: int,
                         settings: RolloutSettings) -> TrajectoryResult:
    """Trajectory ``k`` of ``prompt`` in its own session; an agent exception is recorded on
    the result (never raised). Shared by :class:`RolloutDriver` and the Ray runners."""
    n = prompt.index * settings.n_per_prompt + k
    metadata = {**prompt.metadata, "prompt_index": prompt.index, "sample_index": k}
    result = TrajectoryResult(prompt.index, k)
    started = time.monotonic()
    try:
        result.samples, session_meta = await generate_with_metadata(
            agent, prompt.messages, settings.sampling(n), tracer=tracer,
            metadata=metadata, max_seq_len=settings.max_seq_len, index=n,
            max_turns=settings.max_turns,
        )
        tree = session_meta.get("tree")
        if isinstance(tree, dict):
            result.leaves = len(tree.get("leaves") or [])
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.seconds = time.monotonic() - started
    return result
