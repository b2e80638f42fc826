"""The agent contract (design §7), loading an agent (``--agent``) and running one agent over
one prompt.

An agent is ``async def run_agent(base_url, prompt, request_kwargs, metadata, **kw)
-> dict | None``: ``base_url`` ends in ``/sessions/<id>`` (an OpenAI client uses
``base_url + "/v1"``), ``prompt`` is a messages list, ``request_kwargs`` the sampling
settings in OpenAI names, ``metadata`` the sample metadata plus ``max_seq_len``. The
returned dict is merged into the samples' metadata (``reward`` also sets the reward).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tito.client.errors import RolloutInputError
from tito.client.tracer import SessionTracer, aborted_sample
from tito.samples import Sample
from tito.types.errors import ConfigError
from tito.types.imports import import_from_spec

AgentFn = Callable[..., Awaitable[dict[str, Any] | None]]
AbortFn = Callable[[], Any]
"""An agent module's optional ``abort()``, called when a rollout is interrupted."""

OPENAI_NAMES = {"max_new_tokens": "max_tokens", "sampling_seed": "seed"}
"""Our sampling names -> OpenAI request names."""
REQUEST_FIELDS = frozenset({
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "seed",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "stop_token_ids",
    "chat_template_kwargs"})
"""The sampling fields a chat request to the gateway carries (all of them are fields of
its request model)."""


def to_request_kwargs(sampling: dict[str, Any] | None) -> dict[str, Any]:
    """Sampling settings in OpenAI names (``max_new_tokens`` -> ``max_tokens`` ...)."""
    out: dict[str, Any] = {}
    for key, value in (sampling or {}).items():
        name = OPENAI_NAMES.get(key, key)
        if name not in REQUEST_FIELDS:
            raise ValueError(f"unknown sampling setting {key!r}")
        if value is not None:
            out[name] = value
    return out


def resolve_agent(spec: str, *, flag: str = "--agent", dotted: bool = False
                  ) -> tuple[AgentFn, AbortFn | None]:
    """``module:function`` or ``path/to/file.py:function`` (and ``module.function`` with
    ``dotted``) -> (run_agent, the module's optional ``abort()``).

    The current directory is importable (as with ``python -m``). The rules and messages
    are :func:`tito.types.imports.import_from_spec`'s; any failure is a
    :class:`RolloutInputError` naming ``flag``, the spec and the problem.
    """
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        found = import_from_spec(spec, flag, dotted=dotted, files=True, noun="agent",
                                 require_async=True)
    except ConfigError as exc:
        raise RolloutInputError(exc.message) from exc.__cause__
    abort = getattr(found.module, "abort", None)
    return found.value, abort if callable(abort) else None


async def generate(
    agent: AgentFn,
    prompt: list[dict[str, Any]],
    sampling: dict[str, Any] | None,
    *,
    tracer: SessionTracer,
    metadata: dict[str, Any] | None = None,
    max_seq_len: int | None = None,
    rollout_id: int | str | None = None,
    index: int | None = None,
    **agent_kwargs: Any,
) -> list[Sample]:
    """Run ``agent`` in a fresh session and return its samples.

    The agent's returned dict is merged into every sample's metadata (server keys win);
    its ``reward`` sets ``Sample.reward``. An empty assembly (no generation, or everything
    truncated) gives one ABORTED sample carrying the ``empty_reason``. Agent exceptions
    propagate after the session is deleted.

    When the session returns several samples (a v2 tree with several kept leaves), they
    all get ``rollout_id`` (or ``index`` when it is None), so a trainer counts them as one
    rollout; a single sample keeps ``rollout_id`` None. Several samples with neither is a
    ValueError (the trajectory cannot be grouped).
    """
    samples, _ = await generate_with_metadata(
        agent, prompt, sampling, tracer=tracer, metadata=metadata, max_seq_len=max_seq_len,
        rollout_id=rollout_id, index=index, **agent_kwargs)
    return samples


async def generate_with_metadata(
    agent: AgentFn,
    prompt: list[dict[str, Any]],
    sampling: dict[str, Any] | None,
    *,
    tracer: SessionTracer,
    metadata: dict[str, Any] | None = None,
    max_seq_len: int | None = None,
    rollout_id: int | str | None = None,
    index: int | None = None,
    **agent_kwargs: Any,
) -> tuple[list[Sample], dict[str, Any]]:
    """:func:`generate`, also returning the session's metadata (for v2: its ``tree``)."""
    session = await tracer.create(key=rollout_id if rollout_id is not None else index)
    meta = {**(metadata or {}), "max_seq_len": max_seq_len}
    try:
        result = await agent(session.base_url, prompt, to_request_kwargs(sampling), meta,
                             **agent_kwargs)
    except BaseException:
        await tracer.delete(session)
        raise
    if result is not None and not isinstance(result, dict):
        await tracer.delete(session)
        raise TypeError(f"run_agent must return a dict or None, got {type(result).__name__}")
    agent_meta = result or {}
    decoded = await tracer.collect(session, max_seq_len=max_seq_len,
                                   metadata={**(metadata or {}), **agent_meta})
    samples = decoded.samples or [aborted_sample(f"empty: {decoded.empty_reason}",
                                                 decoded.session_metadata)]
    reward = agent_meta.get("reward")
    for sample in samples:
        sample.metadata = {**(metadata or {}), **agent_meta, **sample.metadata}
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            sample.reward = float(reward)
    if len(samples) > 1:
        group = rollout_id if rollout_id is not None else index
        if group is None:
            raise ValueError(f"the session returned {len(samples)} samples (v2 leaves); pass "
                             "rollout_id or index so that they count as one rollout")
        for sample in samples:
            sample.rollout_id = group
    return samples, decoded.session_metadata
