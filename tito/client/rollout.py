"""The rollout driver behind ``tito rollout``: many agent trajectories against one gateway.

Pure asyncio + HTTP, no UI and no engine management (that is :mod:`tito.cli.rollout`).

- :func:`load_prompts` reads a ``--data`` JSONL file (one ``{"messages": [...],
  "metadata": {...}}`` per line) and raises :class:`RolloutInputError` with the line
  number of the first bad line; :func:`resolve_agent` loads ``--agent``.
- :class:`RolloutDriver` runs ``n_per_prompt`` trajectories per prompt, ``concurrency`` at
  a time, each in its own session (:func:`tito.client.agent.generate_with_metadata`). An
  agent exception is recorded on its :class:`TrajectoryResult` and never touches the other
  trajectories;
  a collect timeout gives the tracer's ABORTED sample. :meth:`RolloutDriver.interrupt`
  (Ctrl-C) calls the agent module's ``abort()``, cancels every running or waiting
  trajectory and deletes the sessions still open; what finished is kept.
- :func:`sample_violations` / :func:`strict_mismatches` are the TITO checks run on every
  sample, and :func:`summarize` the numbers of the final table and ``summary.json``.

TITO invariant violations of a sample (each one is a string in the summary):

1. structure (:func:`tito.samples.sample_problem`): ``tokens`` 1-D, ``0 <= response_length
   <= len(tokens)``, ``loss_mask`` and ``rollout_log_probs`` present (unless the response
   is empty) with exactly ``response_length`` entries, a known ``status``;
2. ``loss_mask`` values are 0 or 1;
3. ``rollout_log_probs`` are finite, ``<= 1e-5`` on generated positions (a log
   probability) and exactly ``0.0`` on bridge positions. Generated positions are those
   of ``loss_mask == 1``, or, for a v2 leaf sample, its ``leaf.completion_spans`` (a
   completion another sample trains keeps its logprobs with its mask zeroed), and the
   mask trains nothing else;
4. a sample that is not ``aborted`` has a non-empty response that starts with a generated
   token (the first turn's output directly follows the first prompt);
5. every entry of the gateway's ``tito_session_mismatch`` report whose type is one of the
   strict classes (:data:`tito.types.mismatch.STRICT_TYPES`: ``special_token_count``,
   ``special_token_type``, ``non_assistant_text``): the accumulated ids differ from the
   canonical render of the committed messages outside assistant text.

Class 5 is also counted on its own as *strict mismatches*. ``assistant_text`` entries are
expected (history assistant tokens are the model's own ids) and only reported.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import logging
import math
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from tito.client.agent import AgentFn, generate_with_metadata, load_agent
from tito.client.tracer import SessionTracer, TracedSession
from tito.samples import STATUSES, Sample, sample_problem
from tito.types.mismatch import MISMATCH_TYPES, STRICT_TYPES

log = logging.getLogger("tito.rollout")

AbortFn = Callable[[], Any]
LOGPROB_TOLERANCE = 1e-5
MAX_REPORTED = 20
"""At most this many violation / error lines are kept in the summary."""


class RolloutInputError(ValueError):
    """Bad ``--agent`` or ``--data`` input; the message is one line for the user."""


# -- input -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PromptItem:
    """One line of the data file."""

    index: int
    """0-based position among the prompts (the ``prompt_index`` of its samples)."""
    messages: list[dict[str, Any]]
    metadata: dict[str, Any]
    line: int
    """1-based line number in the file."""


def _check_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise RolloutInputError(f"{where}: 'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RolloutInputError(f"{where}: messages[{i}] must be an object with a 'role'")
    return messages


def load_prompts(path: str | Path, *, limit: int | None = None) -> list[PromptItem]:
    """The prompts of a JSONL file (blank lines skipped), the first ``limit`` if given.

    Every line is validated, also past ``limit``: a bad file fails before any work.
    """
    path = Path(path)
    if not path.is_file():
        raise RolloutInputError(f"--data {str(path)!r}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RolloutInputError(f"--data {str(path)!r}: cannot read: {exc}") from None
    items: list[PromptItem] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RolloutInputError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})"
                                    ) from None
        if not isinstance(record, dict):
            raise RolloutInputError(f"{where}: expected a JSON object, got "
                                    f"{type(record).__name__}")
        if "messages" not in record:
            raise RolloutInputError(f"{where}: missing 'messages'")
        messages = _check_messages(record["messages"], where)
        metadata = record.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise RolloutInputError(f"{where}: 'metadata' must be an object")
        items.append(PromptItem(len(items), messages, metadata, number))
    if not items:
        raise RolloutInputError(f"--data {str(path)!r}: no prompts in the file")
    return items[:limit] if limit is not None else items


def resolve_agent(spec: str, *, flag: str = "--agent") -> tuple[AgentFn, AbortFn | None]:
    """``module:function`` or ``path/to/file.py:function`` -> (run_agent, optional abort).

    The current directory is importable (as with ``python -m``). Any failure is a
    :class:`RolloutInputError` naming ``flag`` and the problem.
    """
    module_name, sep, attr = spec.rpartition(":")
    if sep and module_name.endswith(".py"):
        file = Path(module_name)
        if not file.is_file():
            raise RolloutInputError(f"{flag} {spec!r}: no such file {module_name!r}")
        module_name = f"_tito_agent_{file.stem}"
        try:
            spec_obj = importlib.util.spec_from_file_location(module_name, file)
            assert spec_obj is not None and spec_obj.loader is not None
            module = importlib.util.module_from_spec(spec_obj)
            sys.modules[module_name] = module
            spec_obj.loader.exec_module(module)
        except Exception as exc:
            raise RolloutInputError(f"{flag} {spec!r}: cannot load {str(file)!r}: "
                                    f"{type(exc).__name__}: {exc}") from None
        spec = f"{module_name}:{attr}"
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return load_agent(spec)
    except ValueError as exc:
        raise RolloutInputError(f"{flag}: {exc}") from None
    except Exception as exc:  # the module raised while importing (SyntaxError, ...)
        raise RolloutInputError(f"{flag} {spec!r}: importing it raised "
                                f"{type(exc).__name__}: {exc}") from None


# -- driver ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RolloutSettings:
    """How trajectories are run (the ``tito rollout`` flags of the same names)."""

    concurrency: int = 8
    n_per_prompt: int = 1
    max_turns: int = 3
    max_seq_len: int | None = None
    max_new_tokens: int = 64
    temperature: float = 0.7
    seed: int | None = None
    """Trajectory ``t`` (``prompt_index * n_per_prompt + sample_index``) samples with
    ``seed + t``; None: unseeded."""
    collect_timeout: float = 120.0

    def __post_init__(self) -> None:
        for name in ("concurrency", "n_per_prompt", "max_turns", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.collect_timeout <= 0:
            raise ValueError("collect_timeout must be positive")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ValueError("max_seq_len must be at least 2")

    def sampling(self, trajectory: int) -> dict[str, Any]:
        """The sampling settings of one trajectory (our names; the agent gets OpenAI's)."""
        out: dict[str, Any] = {"max_new_tokens": self.max_new_tokens,
                               "temperature": self.temperature}
        if self.seed is not None:
            out["sampling_seed"] = self.seed + trajectory
        return out


@dataclass(slots=True)
class TrajectoryResult:
    """One finished trajectory: its samples, or the error its agent raised."""

    prompt_index: int
    sample_index: int
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    leaves: int = 0
    """v2: leaves of the session's tree (0 for v1)."""

    @property
    def label(self) -> str:
        return f"prompt {self.prompt_index} sample {self.sample_index}"


@dataclass(slots=True)
class RolloutResult:
    """Everything the driver produced; :func:`summarize` turns it into numbers."""

    trajectories: list[TrajectoryResult]
    requested: int
    cancelled: int = 0
    interrupted: bool = False
    abort_hook_called: bool = False
    sessions_deleted_at_exit: int = 0
    wall_time: float = 0.0
    requeued: int = 0
    """On Ray: trajectories run again because their node (or gateway) was lost."""
    duplicates_dropped: int = 0
    """On Ray: results of a trajectory already recorded (never written twice)."""

    def samples(self) -> list[tuple[TrajectoryResult, Sample]]:
        """Every sample with its trajectory, ordered by (prompt, sample) index."""
        ordered = sorted(self.trajectories, key=lambda t: (t.prompt_index, t.sample_index))
        return [(t, s) for t in ordered for s in t.samples]


class _TrackingTracer(SessionTracer):
    """A tracer that remembers the sessions it has not deleted yet."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open_sessions: dict[str, TracedSession] = {}

    async def create(self, key: object = None) -> TracedSession:
        session = await super().create(key)
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


# -- checks ----------------------------------------------------------------------------
def strict_mismatches(sample: Sample) -> list[dict[str, Any]]:
    """The strict-class entries of the sample's ``tito_session_mismatch`` report."""
    report = sample.metadata.get("tito_session_mismatch") or []
    return [m for m in report if isinstance(m, dict) and m.get("type") in STRICT_TYPES]


def sample_violations(sample: Sample) -> list[str]:
    """The TITO invariant violations of one sample (module docstring, classes 1-5)."""
    problem = sample_problem(sample)
    if problem is not None:
        return [problem]
    out: list[str] = []
    rl = sample.response_length
    mask, logprobs = sample.loss_mask, sample.rollout_log_probs
    if rl and (mask is None or logprobs is None):
        out.append("loss_mask / rollout_log_probs missing for a non-empty response")
    if mask is not None and logprobs is not None and rl:
        out.extend(_training_field_problems(sample, np.asarray(mask).astype(np.int64),
                                            np.asarray(logprobs, dtype=np.float64)))
    if sample.status != "aborted" and rl == 0:
        out.append(f"{sample.status} sample with an empty response")
    out.extend(f"strict mismatch {m.get('type')}: {m.get('detail', '')}"
               for m in strict_mismatches(sample))
    return out


def _generated_positions(sample: Sample, mask: np.ndarray) -> np.ndarray:
    """Which response positions hold generated ids (bool, ``response_length`` entries)."""
    leaf = sample.metadata.get("leaf")
    if not isinstance(leaf, dict) or not isinstance(leaf.get("completion_spans"), list):
        return mask != 0
    generated = np.zeros(sample.response_length, dtype=bool)
    prompt = sample.prompt_length
    for _node, start, end in leaf["completion_spans"]:
        generated[max(start - prompt, 0) : max(end - prompt, 0)] = True
    return generated


def _training_field_problems(sample: Sample, mask: np.ndarray, lp: np.ndarray) -> list[str]:
    out: list[str] = []
    if not np.isin(mask, (0, 1)).all():
        out.append("loss_mask has values other than 0 and 1")
    generated = _generated_positions(sample, mask)
    if (mask.astype(bool) & ~generated).any():
        out.append("loss_mask trains a position that was not generated")
    if not np.isfinite(lp).all():
        out.append("rollout_log_probs has non-finite values")
    elif (lp[generated] > LOGPROB_TOLERANCE).any():
        out.append("rollout_log_probs has positive values on generated tokens")
    if (lp[~generated] != 0.0).any():
        out.append("rollout_log_probs is not 0.0 on bridge tokens")
    if sample.status != "aborted" and not generated[0]:
        out.append("the response does not start with a generated token")
    return out


# -- summary ---------------------------------------------------------------------------
@dataclass(slots=True)
class RolloutSummary:
    """The numbers of the final table; :meth:`to_dict` is ``summary.json``."""

    trajectories: int = 0
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    samples: int = 0
    leaves: int = 0
    """v2: leaves of the trajectory trees (0 with v1 sessions)."""
    dropped_leaves: int = 0
    """v2: leaves that gave no sample (superseded retries, truncated away)."""
    turns: int = 0
    """Turns kept in the samples (assembly may drop turns, e.g. after truncation)."""
    turns_run: int = 0
    """Turns the gateway recorded (``num_turns`` of each session)."""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    bridge_tokens: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    collect_failures: int = 0
    empty_samples: int = 0
    tito_violations: int = 0
    strict_mismatches: int = 0
    mismatches_by_type: dict[str, int] = field(default_factory=dict)
    mismatch_check_errors: int = 0
    mixed_version_samples: int = 0
    """Samples whose generated ids came from more than one weight version."""
    mixed_version_share: float = 0.0
    mean_reward: float | None = None
    rewarded_samples: int = 0
    wall_time_s: float = 0.0
    generated_tokens_per_s: float = 0.0
    interrupted: bool = False
    abort_hook_called: bool = False
    sessions_deleted_at_exit: int = 0
    requeued_trajectories: int = 0
    """On Ray: trajectories run again after their node or gateway was lost."""
    duplicates_dropped: int = 0
    violations: list[str] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing failed: every trajectory finished, no violation, no strict mismatch."""
        return (not self.interrupted and self.failed == 0 and self.cancelled == 0
                and self.tito_violations == 0 and self.strict_mismatches == 0)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _mixed_versions(sample: Sample) -> bool:
    """Whether the sample's generated ids came from more than one weight version."""
    spans = sample.metadata.get("weight_version_spans")
    if isinstance(spans, list) and spans:
        return len({span.get("version") for span in spans if isinstance(span, dict)}) > 1
    return len(set(sample.weight_versions)) > 1


def _count_trajectory(s: RolloutSummary, traj: TrajectoryResult) -> None:
    if traj.error is not None:
        s.failed += 1
        if len(s.errors) < MAX_REPORTED:
            s.errors.append({"prompt_index": traj.prompt_index,
                             "sample_index": traj.sample_index, "error": traj.error})
        return
    s.finished += 1
    if traj.leaves:
        s.leaves += traj.leaves
        s.dropped_leaves += max(traj.leaves - len(traj.samples), 0)


def summarize(result: RolloutResult) -> RolloutSummary:
    """Count everything the table and ``summary.json`` show."""
    s = RolloutSummary(trajectories=result.requested, cancelled=result.cancelled,
                       interrupted=result.interrupted,
                       abort_hook_called=result.abort_hook_called,
                       sessions_deleted_at_exit=result.sessions_deleted_at_exit,
                       requeued_trajectories=result.requeued,
                       duplicates_dropped=result.duplicates_dropped,
                       wall_time_s=round(result.wall_time, 3))
    # the statuses assembly gives, always shown; a decoded "pending"/"failed" only if seen
    statuses: Counter[str] = Counter(dict.fromkeys(STATUSES[:3], 0))
    by_type: Counter[str] = Counter(dict.fromkeys(MISMATCH_TYPES, 0))
    rewards: list[float] = []
    for traj in result.trajectories:
        _count_trajectory(s, traj)
    for traj, sample in result.samples():
        s.samples += 1
        statuses[sample.status] += 1
        meta = sample.metadata
        turns_run = int(meta.get("num_turns") or 0)
        lifecycle = meta.get("lifecycle")
        s.turns += len(lifecycle) if isinstance(lifecycle, list) else turns_run
        s.turns_run += turns_run
        s.prompt_tokens += sample.prompt_length if sample.response_length else 0
        generated = int(np.asarray(sample.loss_mask).sum()) if sample.loss_mask is not None else 0
        s.generated_tokens += generated
        s.bridge_tokens += sample.response_length - generated
        reason = str(meta.get("aborted_reason") or "")
        s.collect_failures += reason.startswith("collect failed")
        s.empty_samples += reason.startswith("empty")
        s.mismatch_check_errors += "tito_session_mismatch_error" in meta
        for item in meta.get("tito_session_mismatch") or []:
            if isinstance(item, dict) and item.get("type") in by_type:
                by_type[item["type"]] += 1
        s.strict_mismatches += len(strict_mismatches(sample))
        s.mixed_version_samples += _mixed_versions(sample)
        problems = sample_violations(sample)
        s.tito_violations += len(problems)
        for problem in problems[: max(0, MAX_REPORTED - len(s.violations))]:
            s.violations.append(f"{traj.label}: {problem}")
        reward = sample.reward
        if reward is not None and math.isfinite(reward):
            rewards.append(float(reward))
    s.statuses = dict(statuses)
    s.mixed_version_share = round(s.mixed_version_samples / s.samples, 4) if s.samples else 0.0
    s.mismatches_by_type = dict(by_type)
    s.rewarded_samples = len(rewards)
    s.mean_reward = round(sum(rewards) / len(rewards), 6) if rewards else None
    if result.wall_time > 0:
        s.generated_tokens_per_s = round(s.generated_tokens / result.wall_time, 2)
    return s
