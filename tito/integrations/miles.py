"""tito under the reference RL framework (miles; slime shares its rollout interfaces).

Switch a framework run from its own session server to a ``tito serve`` by changing the
generate function and naming the gateway::

    --custom-generate-function-path tito.integrations.miles.generate
    --tito-url http://127.0.0.1:8000            # or TITO_URL in the environment
    --custom-agent-function-path my_agents.swe.run_agent    # unchanged

(and dropping ``--use-session-server``). slime and other users of the legacy form set
``tito.integrations.miles.generate_legacy``. The agent keeps the framework's contract:
``async run_agent(base_url, prompt, request_kwargs, metadata) -> dict | None``, where
``base_url`` already ends in ``/sessions/<id>``, ``prompt`` is a list of messages (a
string prompt becomes one user message), ``request_kwargs`` are the sampling params in
OpenAI names (``max_new_tokens`` -> ``max_tokens``, ``sampling_seed`` -> ``seed``; names a
chat request does not carry are dropped) and ``metadata`` is the sample's metadata plus
``max_seq_len``, ``session_server_id`` and ``session_server_instance_id``. The agent
module's optional ``abort`` (with ``args`` when it takes a parameter) is called when a
trajectory is cancelled.

One trajectory: create a session, run the agent, collect with one ``POST .../samples``
(the session is deleted in ``finally``), and overlay the decoded samples onto copies of
the framework's input sample. As the framework's own agentic generate does, an agent that
raises still has its committed turns collected (``metadata.agent_error`` says what it
raised), a collect that times out or loses its connection gives one ABORTED copy of the
input, and a gateway error reply (4xx/5xx) raises. A v1 session returns one sample (its
session metadata merged into the sample's); a v2 session returns a list, and several
samples share the input's ``rollout_id`` (or its ``index``).

The framework is not a dependency: everything here is duck-typed against its field names
(``Sample.tokens``, ``.loss_mask``, ``.status`` ...). When the framework is importable,
the new form returns its own ``GenerateFnOutput``; otherwise :class:`GenerateOutput`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import enum
import functools
import inspect
import logging
import os
import random
import sys
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import httpx

from tito.client.agent import OPENAI_NAMES, REQUEST_FIELDS, AgentFn, resolve_agent
from tito.client.tracer import CollectError, SessionTracer, TracedSession
from tito.samples import DecodedSamples, Sample
from tito.types.errors import ConfigError
from tito.types.imports import import_object

__all__ = [
    "GenerateOutput",
    "LegacyGenerateAdapter",
    "add_arguments",
    "generate",
    "generate_legacy",
    "load_generate_function",
]
"""The public names (the framework loads ``generate`` / ``generate_legacy`` by path)."""

log = logging.getLogger("tito.integrations.miles")

ENV_URL = "TITO_URL"
ENV_API_KEY = "TITO_API_KEY"
DEFAULT_TIMEOUT = 120.0
"""Seconds for each gateway call of the integration (create, collect, delete), as the
framework's own tracer allows."""

FRAMEWORK_NAMES = {**OPENAI_NAMES, "min_new_tokens": "min_tokens"}
"""The framework's sampling names -> OpenAI request names."""

AbortHook = Callable[..., Any]


class GenerateInput(Protocol):
    """What the framework passes to a new-form generate function (``GenerateFnInput``)."""

    @property
    def args(self) -> Any: ...
    @property
    def sample(self) -> Any: ...
    @property
    def sampling_params(self) -> dict[str, Any]: ...
    @property
    def evaluation(self) -> bool: ...


@dataclass(frozen=True)
class GenerateOutput:
    """The framework's ``GenerateFnOutput`` shape, used when the framework is absent."""

    samples: Any
    """One sample, or a list of samples."""


@dataclass(frozen=True, slots=True)
class Settings:
    """The integration's settings, read from the framework's ``args``."""

    urls: tuple[str, ...]
    agent_path: str
    max_seq_len: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    api_key: str | None = None
    lifecycle: str = "finish"
    """``finish`` (finish -> samples with its snapshot -> delete) or ``samples`` (the
    older samples -> delete)."""


LIFECYCLES = ("finish", "samples")
SESSION_DEFAULTS = ("temperature", "top_p", "top_k")
"""Sampling params sent as the session's defaults (``POST /sessions``)."""


def settings_from_args(args: Any) -> Settings:
    """``args.tito_url`` (else ``$TITO_URL``; several URLs comma-separated, one picked at
    random per session), ``args.custom_agent_function_path``, ``args.max_seq_len``,
    ``args.tito_timeout``, ``args.tito_api_key`` (else ``$TITO_API_KEY``). A missing or
    malformed setting is a ValueError naming the flag."""
    raw = getattr(args, "tito_url", None) or os.environ.get(ENV_URL)
    if not raw:
        raise ValueError(f"no tito gateway: pass --tito-url URL or set {ENV_URL}")
    urls = tuple(u.strip().rstrip("/") for u in str(raw).split(",") if u.strip())
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if not urls or bad:
        raise ValueError(f"--tito-url must be http(s) URLs, comma-separated; got {raw!r}")
    agent_path = getattr(args, "custom_agent_function_path", None)
    if not agent_path:
        raise ValueError("tito.integrations.miles needs --custom-agent-function-path "
                         "(the agent to run in each session)")
    max_seq_len = getattr(args, "max_seq_len", None)
    if max_seq_len is not None and (isinstance(max_seq_len, bool)
                                    or not isinstance(max_seq_len, int) or max_seq_len < 2):
        raise ValueError(f"--max-seq-len must be an integer >= 2, got {max_seq_len!r}")
    timeout = getattr(args, "tito_timeout", None) or DEFAULT_TIMEOUT
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"--tito-timeout must be a positive number, got {timeout!r}")
    api_key = getattr(args, "tito_api_key", None) or os.environ.get(ENV_API_KEY)
    lifecycle = getattr(args, "tito_lifecycle", None) or "finish"
    if lifecycle not in LIFECYCLES:
        raise ValueError(f"--tito-lifecycle must be one of {', '.join(LIFECYCLES)}, "
                         f"got {lifecycle!r}")
    return Settings(urls, str(agent_path), max_seq_len, float(timeout), api_key, lifecycle)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The integration's flags (the framework calls ``generate.add_arguments``); a flag
    the parser already has is left as it is."""
    flags: list[tuple[str, dict[str, Any]]] = [
        ("--tito-url", {"default": None, "help": f"tito gateway URL(s), comma-separated "
                                                 f"(default: ${ENV_URL})"}),
        ("--tito-api-key", {"default": None, "help": f"the gateway's --api-key "
                                                     f"(default: ${ENV_API_KEY})"}),
        ("--tito-timeout", {"type": float, "default": DEFAULT_TIMEOUT,
                            "help": "seconds for each session create/collect/delete call"}),
        ("--tito-lifecycle", {"choices": LIFECYCLES, "default": "finish",
                              "help": "collect with finish -> samples -> delete (finish) "
                                      "or samples -> delete (samples)"}),
        ("--custom-agent-function-path", {"type": str, "default": None,
                                          "help": "the agent: module.function"}),
        ("--max-seq-len", {"type": int, "default": None, "dest": "max_seq_len",
                           "help": "max prompt + completion tokens per trajectory "
                                   "(samples are truncated by the gateway)"}),
    ]
    for flag, options in flags:
        try:
            parser.add_argument(flag, **options)
        except argparse.ArgumentError:  # the framework (or another plugin) defines it
            continue


def request_kwargs(sampling_params: dict[str, Any] | None) -> dict[str, Any]:
    """The framework's sampling params as chat request fields: renamed
    (``max_new_tokens`` -> ``max_tokens`` unless ``max_tokens`` is set), engine-only names
    (``skip_special_tokens``, ``no_stop_trim`` ...) and None values dropped."""
    params = dict(sampling_params or {})
    for ours, openai_name in FRAMEWORK_NAMES.items():
        if ours in params:
            value = params.pop(ours)
            params.setdefault(openai_name, value)
    return {k: v for k, v in params.items() if k in REQUEST_FIELDS and v is not None}


def prompt_messages(prompt: Any) -> list[dict[str, Any]]:
    """The sample's prompt as a messages list (a string is one user message)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        return [dict(m) for m in prompt]
    raise ValueError(f"sample.prompt must be a string or a list of message dicts, got "
                     f"{type(prompt).__name__}")


@functools.cache
def load_agent_function(path: str) -> tuple[AgentFn, AbortHook | None]:
    """``pkg.module.function`` (the framework's form), ``pkg.module:function`` or
    ``path/to/file.py:function`` -> (run_agent, the module's optional ``abort``); a
    :class:`~tito.client.errors.RolloutInputError` (a ``ValueError``) when it cannot."""
    return resolve_agent(path, flag="--custom-agent-function-path", dotted=True)


# -- one trajectory --------------------------------------------------------------------
async def run_trajectory(args: Any, sample: Any, sampling_params: dict[str, Any],
                         evaluation: bool = False) -> tuple[list[Any], bool]:
    """Run the configured agent on ``sample`` in a fresh session; return the framework
    samples and whether the framework wants them as a list (a v2 session, or several)."""
    settings = settings_from_args(args)
    agent, abort = load_agent_function(settings.agent_path)
    url = random.choice(settings.urls)
    client = _client(settings)
    tracer = SessionTracer(url, timeout=settings.timeout, client=client)
    facts = await gateway_facts(client, url)
    check_framework_options(args, facts.get("session_version"), url)
    server_id = url.split("://", 1)[1]
    metadata = {**(getattr(sample, "metadata", None) or {}), "session_server_id": server_id}
    if "instance_id" in facts:
        metadata["session_server_instance_id"] = facts["instance_id"]
    session = await create_session(tracer, settings.timeout,
                                   options=session_options(sampling_params, evaluation))
    if settings.max_seq_len is not None:
        metadata["max_seq_len"] = settings.max_seq_len
    agent_meta: dict[str, Any] = {}
    finished = False
    try:
        result = await agent(base_url=session.base_url,
                             prompt=prompt_messages(getattr(sample, "prompt", "")),
                             request_kwargs=request_kwargs(sampling_params),
                             metadata=metadata)
    except asyncio.CancelledError:
        await _call_abort(abort, args)
        await tracer.delete(session)
        raise
    except Exception as exc:  # collected anyway: the committed turns still train
        log.warning("[session=%s] the agent raised %s: %s", session.session_id,
                    type(exc).__name__, exc, exc_info=True)
        agent_meta["agent_error"] = f"{type(exc).__name__}: {exc}"
    else:
        finished = agent_outcome(result, agent_meta)
    try:
        decoded = await collect(tracer, session, settings, agent_meta,
                                producer_finished=finished and "agent_error" not in agent_meta,
                                per_call=weight_versions_type(sample) is not None)
    except (httpx.TimeoutException, httpx.TransportError) as exc:
        log.warning("[session=%s] collecting failed: %r", session.session_id, exc)
        failed = aborted_copy(sample, f"collect failed: {exc!r}")
        failed.metadata["session_server_id"] = server_id
        return [failed], getattr(args, "use_session_server", None) == "v2"
    samples, as_list = framework_samples(decoded, sample, agent_meta)
    for s in samples:
        s.metadata["session_server_id"] = server_id
    return samples, as_list


def agent_outcome(result: Any, agent_meta: dict[str, Any]) -> bool:
    """What the agent returned, into ``agent_meta``; whether it says it finished its work.
    A dict (or None) is the older contract: returning asserts every producer was joined.
    The framework's newer ``AgentResult(metadata=..., producer_finished=...)`` (any object
    with those two attributes) says it itself (its harness module is not imported)."""
    if isinstance(result, dict):
        agent_meta.update(result)
        return True
    if result is None:
        return True
    if hasattr(result, "producer_finished") and hasattr(result, "metadata"):
        metadata = result.metadata
        if isinstance(metadata, dict):
            agent_meta.update(metadata)
        elif metadata is not None:
            agent_meta["agent_error"] = (f"AgentResult.metadata is "
                                         f"{type(metadata).__name__}, not a dict or None")
        return result.producer_finished is True
    agent_meta["agent_error"] = (f"run_agent returned {type(result).__name__}, not a dict, "
                                 "None or an AgentResult")
    return True


async def collect(tracer: SessionTracer, session: TracedSession, settings: Settings,
                  agent_meta: dict[str, Any], *, producer_finished: bool = True,
                  per_call: bool = False) -> DecodedSamples:
    """Collect in the configured lifecycle: ``finish`` (an agent that raised, or said it
    did not finish, leaves an incomplete snapshot) -> samples of its snapshot -> delete,
    or ``samples`` -> delete. The session is deleted whatever happens. ``per_call``: ask
    for the weight versions as per-call spans (a framework with ``WeightVersionsPerCall``)."""
    snapshot = None
    if settings.lifecycle == "finish":
        try:
            snapshot = (await tracer.finish(
                session, producer_finished=producer_finished,
                timeout=min(settings.timeout, 90.0)))["snapshot_id"]
        except BaseException:
            await tracer.delete(session)
            raise
    return await tracer.collect(session, max_seq_len=settings.max_seq_len,
                                metadata=agent_meta, abort_on_transport_error=False,
                                snapshot_id=snapshot,
                                weight_versions_format="spans" if per_call else None)


RETRY_CREATE = frozenset({429, 502, 503, 504})
"""Statuses on which session creation is retried: too many sessions (back-pressure), the
gateway's engine or a proxy in front of it not answering."""


def session_options(sampling_params: dict[str, Any] | None, evaluation: bool
                    ) -> dict[str, Any]:
    """The ``POST /sessions`` body: ``evaluation`` and the sampling defaults."""
    params = sampling_params or {}
    return {"evaluation": bool(evaluation),
            **{k: params[k] for k in SESSION_DEFAULTS if params.get(k) is not None}}


async def create_session(tracer: SessionTracer, budget: float, pause: float = 1.0, *,
                         options: dict[str, Any] | None = None) -> TracedSession:
    """``POST /sessions``, retried every ``pause`` seconds for up to ``budget`` seconds
    while the gateway cannot be reached or answers a status of :data:`RETRY_CREATE`
    (a gateway restarting, or full): a trajectory waits rather than failing the rollout.
    Anything else (401, a bad URL path) raises at once."""
    deadline = asyncio.get_running_loop().time() + budget
    while True:
        try:
            return await tracer.create(options=options)
        except (httpx.TransportError, CollectError) as exc:
            retry = not isinstance(exc, CollectError) or exc.status in RETRY_CREATE
            if not retry or asyncio.get_running_loop().time() + pause > deadline:
                raise
            log.info("creating a session on %s failed (%s); retrying", tracer.gateway_url, exc)
        await asyncio.sleep(pause)


def framework_samples(decoded: DecodedSamples, template: Any, agent_meta: dict[str, Any]
                      ) -> tuple[list[Any], bool]:
    """Decoded samples as copies of the framework's input sample, with the rollout_id
    rule; also whether they go back as a list (v2, or several)."""
    session_meta = decoded.session_metadata
    as_list = session_meta.get("session_version") == "v2" or len(decoded.samples) > 1
    if not decoded.samples:
        reason = f"empty: {decoded.empty_reason}"
        log.warning("[session=%s] no samples (%s)", session_meta.get("session_id"),
                    decoded.empty_reason)
        return [aborted_copy(template, reason)], as_list
    samples = [overlay(s, template) for s in decoded.samples]
    instance = session_meta.get("instance_id")
    tool_time = (agent_meta.get("agent_metrics") or {}).get("total_tool_time")
    for s in samples:
        if instance is not None:
            s.metadata["session_server_instance_id"] = instance
        if not as_list:  # v1: the session's facts on the sample, as the framework does
            s.metadata.update(session_meta)
        if tool_time is not None:  # time outside generation, for throughput accounting
            s.non_generation_time = tool_time
    if len(samples) > 1:
        group = getattr(template, "rollout_id", None)
        if group is None:
            group = getattr(template, "index", None)
        if group is None:
            raise ValueError(f"the session returned {len(samples)} samples (v2 leaves); the "
                             "input sample needs a rollout_id or an index to group them")
        for s in samples:
            s.rollout_id = group
    return samples, as_list


def overlay(sample: Sample, template: Any) -> Any:
    """A deep copy of the framework's ``template`` sample with the wire fields of
    ``sample``: lists for tokens / loss mask / logprobs (as the framework's decoder
    gives), int32 arrays for the replay tensors, its ``Status`` and ``PrefixCacheInfo``
    types, the server metadata merged over the input's, and a server-assigned reward."""
    out = copy.deepcopy(template)
    out.tokens = sample.tokens.tolist()
    out.response = sample.response if sample.response is not None else ""
    out.response_length = int(sample.response_length)
    out.loss_mask = None if sample.loss_mask is None else sample.loss_mask.tolist()
    out.rollout_log_probs = (None if sample.rollout_log_probs is None
                             else sample.rollout_log_probs.tolist())
    out.rollout_routed_experts = sample.rollout_routed_experts
    out.rollout_indexer_topk = sample.rollout_indexer_topk
    if sample.rollout_sampling_mask is not None:  # --sampling-mask-replay only
        out.rollout_sampling_mask = sample.rollout_sampling_mask
        out.rollout_sampling_mask_offsets = sample.rollout_sampling_mask_offsets
    out.status = status_value(template, sample.status)
    out.weight_versions = framework_weight_versions(sample, template)
    out.prefix_cache_info = _prefix_cache_info(template, sample.prefix_cache_info)
    if sample.spec_info is not None and hasattr(template, "spec_info"):
        out.spec_info = framework_spec_info(template, sample.spec_info)
    out.metadata = {**(getattr(template, "metadata", None) or {}), **sample.metadata}
    if sample.reward is not None:
        out.reward = sample.reward
    return out


def aborted_copy(template: Any, reason: str) -> Any:
    """A deep copy of the input sample marked ABORTED, with ``metadata.aborted_reason``."""
    out = copy.deepcopy(template)
    out.status = status_value(template, "aborted")
    out.metadata = {**(getattr(template, "metadata", None) or {}), "aborted_reason": reason}
    return out


def status_value(template: Any, status: str) -> Any:
    """``status`` as the framework's ``Sample.Status`` member (its values are ours)."""
    kind = getattr(type(template), "Status", None)
    if not (isinstance(kind, type) and issubclass(kind, enum.Enum)):
        current = getattr(template, "status", None)
        kind = type(current) if isinstance(current, enum.Enum) else None
    return status if kind is None else kind(status)


def weight_versions_type(template: Any) -> Any:
    """The framework's ``WeightVersionsPerCall`` (its newer ``Sample.weight_versions``
    holds one per engine call), found beside its ``Sample`` type; None for a framework
    whose ``weight_versions`` is a list of version strings."""
    module = sys.modules.get(type(template).__module__)
    found = getattr(module, "WeightVersionsPerCall", None)
    return found if callable(getattr(found, "from_dicts", None)) else None


def framework_weight_versions(sample: Sample, template: Any) -> list[Any]:
    """``sample``'s weight versions in the framework's type: one ``WeightVersionsPerCall``
    per kept turn (its ``{version, abs_start, abs_end}`` spans over ``tokens``) when it
    has that type, else one version string per kept turn."""
    per_call = weight_versions_type(template)
    if per_call is None:
        return list(sample.weight_versions)
    return [per_call.from_dicts([dict(span) for span in call])
            for call in sample.weight_version_calls]


SPEC_FIELDS = (("spec_num_correct_drafts", "spec_accept_token_num"),
               ("spec_num_proposed_drafts", "spec_draft_token_num"),
               ("spec_verify_ct", "spec_verify_ct"),
               ("completion_tokens", "completion_token_num"))
"""Our ``spec_info`` counters -> the framework's ``SpecInfo`` attributes: its newer
names, or those of 31f1ca96."""


def framework_spec_info(template: Any, info: dict[str, int]) -> Any:
    """``info`` as a fresh instance of the framework's ``SpecInfo`` type (either naming of
    its counters), or a plain dict when it has none."""
    current = getattr(template, "spec_info", None)
    kind: Any = type(current)
    try:
        out = kind() if current is not None else None
    except TypeError:
        out = None
    if out is None:
        return dict(info)
    for ours, older in SPEC_FIELDS:
        name = ours if hasattr(out, ours) else older
        if hasattr(out, name):
            setattr(out, name, int(info.get(ours, 0)))
    return out


def _prefix_cache_info(template: Any, info: dict[str, int]) -> Any:
    from_dict = getattr(type(getattr(template, "prefix_cache_info", None)), "from_dict", None)
    return from_dict(dict(info)) if callable(from_dict) else dict(info)


# -- the two generate-function forms ---------------------------------------------------
async def generate(input: GenerateInput) -> Any:
    """The new form: ``async def generate(input) -> output``. ``input.evaluation`` runs the
    same way (the framework's agentic generate does not tell them apart either)."""
    samples, as_list = await run_trajectory(input.args, input.sample, input.sampling_params,
                                            bool(input.evaluation))
    return generate_output(samples if as_list else samples[0])


async def generate_legacy(args: Any, sample: Any, sampling_params: dict[str, Any],
                          evaluation: bool = False) -> Any:
    """The legacy form: ``async def generate(args, sample, sampling_params)`` -> one
    sample, or a list of samples for a v2 session."""
    samples, as_list = await run_trajectory(args, sample, sampling_params, evaluation)
    return samples if as_list else samples[0]


generate.add_arguments = add_arguments  # type: ignore[attr-defined]
generate_legacy.add_arguments = add_arguments  # type: ignore[attr-defined]


@functools.cache
def output_type() -> type:
    """The framework's ``GenerateFnOutput`` when it is importable, else ours."""
    try:
        return cast(type, import_object("miles.rollout.base_types:GenerateFnOutput",
                                        "the framework's output type"))
    except ConfigError:  # absent, or a partial install: the duck-typed stand-in
        return GenerateOutput


def generate_output(samples: Any) -> Any:
    return output_type()(samples=samples)


class LegacyGenerateAdapter:
    """A legacy ``generate(args, sample, sampling_params[, evaluation=])`` called in the new
    form; a result that is not already an output object is wrapped in one."""

    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self.fn = fn
        self.takes_evaluation = "evaluation" in inspect.signature(fn).parameters

    async def __call__(self, input: GenerateInput) -> Any:
        extra = {"evaluation": input.evaluation} if self.takes_evaluation else {}
        result = await self.fn(input.args, input.sample, input.sampling_params, **extra)
        if isinstance(result, (output_type(), GenerateOutput)):
            return result
        return generate_output(result)


def is_legacy_generate_function(fn: Callable[..., Any]) -> bool:
    """The legacy form takes (args, sample, sampling_params, ...): three or more
    parameters, the first not named ``input``."""
    names = list(inspect.signature(fn).parameters)
    return len(names) >= 3 and names[0] != "input"


def load_generate_function(path: str | None) -> Callable[[GenerateInput], Awaitable[Any]] | None:
    """What the framework's loader does, for any generate function: ``module.attr`` (or
    ``module:attr``) -> a new-form callable. A class is instantiated, a legacy function is
    adapted, a new-form function is returned as it is; an empty path is None. A path that
    names nothing callable is a :class:`~tito.types.errors.ConfigError`."""
    if not path:
        return None
    fn: Any = import_object(path, "generate function", dotted=True, callable_=True)
    if inspect.isclass(fn):
        return cast("Callable[[GenerateInput], Awaitable[Any]]", fn())
    if is_legacy_generate_function(fn):
        return LegacyGenerateAdapter(fn)
    return cast("Callable[[GenerateInput], Awaitable[Any]]", fn)


# -- plumbing ----------------------------------------------------------------------------
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                    dict[tuple[str | None, float], httpx.AsyncClient]] = (
    weakref.WeakKeyDictionary())
_aborts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                   dict[int, asyncio.Task[None]]] = weakref.WeakKeyDictionary()


def _client(settings: Settings) -> httpx.AsyncClient:
    """One pooled client per event loop (and key/timeout): a rollout runs hundreds of
    trajectories at once, and each new client would open new connections."""
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    key = (settings.api_key, settings.timeout)
    client = per_loop.get(key)
    if client is None or client.is_closed:
        headers = {"authorization": f"Bearer {settings.api_key}"} if settings.api_key else None
        client = httpx.AsyncClient(
            timeout=settings.timeout, headers=headers,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        per_loop[key] = client
    return client


_facts: dict[str, dict[str, Any]] = {}


async def gateway_facts(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """The gateway's ``instance_id`` and ``session_version`` (from ``/health``, once per
    URL); empty when it does not answer (then asked again next time)."""
    known = _facts.get(url)
    if known is None:
        try:
            body = (await client.get(f"{url}/health")).json()
        except (httpx.HTTPError, ValueError):
            return {}
        if not isinstance(body, dict) or not isinstance(body.get("instance_id"), str):
            return {}
        known = {"instance_id": body["instance_id"],
                 "session_version": body.get("session_version")}
        _facts[url] = known
    return known


V2_REFUSED = ("group_rm", "recompute_logprobs_via_prefill")
"""The framework's options that need one sample per trajectory (refused against v2)."""


def check_framework_options(args: Any, session_version: str | None, url: str) -> None:
    if session_version != "v2":
        return
    for name in V2_REFUSED:
        if getattr(args, name, False):
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} is not supported with the v2 sessions of {url}: a v2 "
                             "trajectory returns a list of samples")


async def aclose_clients() -> None:
    """Close this event loop's pooled clients (for tests and orderly shutdowns)."""
    for client in _clients.pop(asyncio.get_running_loop(), {}).values():
        await client.aclose()


async def _call_abort(abort: AbortHook | None, args: Any) -> None:
    """Call the agent module's ``abort`` (with ``args`` when it takes a parameter). The
    cancellations of one burst share one call: a rollout that stops cancels every
    trajectory at once, and the hook tears the agent backend down once."""
    if abort is None:
        return
    per_loop = _aborts.setdefault(asyncio.get_running_loop(), {})
    task = per_loop.get(id(abort))
    if task is None or task.done():
        task = asyncio.ensure_future(_run_abort(abort, args))
        per_loop[id(abort)] = task
    await asyncio.shield(task)


async def _run_abort(abort: AbortHook, args: Any) -> None:
    try:
        outcome = abort(args) if inspect.signature(abort).parameters else abort()
        if inspect.isawaitable(outcome):
            await outcome
    except Exception as exc:
        log.warning("the agent's abort hook raised %s: %s", type(exc).__name__, exc)
