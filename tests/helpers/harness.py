"""Driving real agent harnesses against the real gateway over the mock engine.

The harness suite (``tests/harnesses/``) runs each harness — OpenAI Agents SDK,
pydantic-ai, LangChain, smolagents, mini-swe-agent — for real: its own HTTP client, its
own message history, its own tool loop. Only the model is scripted: the mock engine reads
the directives (``CALL``, ``SAY``, ``THINK``) of the last user or tool message, so a
tool's result holds the next directive and the conversation is fixed.

Every harness plays the same conversation of :data:`MODEL_CALLS` model calls:

1. the task (:data:`TASK`): a reasoning block (``THINK``) and a call of ``get_weather``;
2. the tool's result (:func:`weather`) asks for a text answer;
3. a follow-up user message (:data:`FOLLOW_UP`) on the same history.

:meth:`Trajectory.check` then proves the product's promise for the session: every model
call the harness made is a turn of the gateway and of the engine, and is in a collected
training sample, with no strict mismatch.

Nothing here may reach a real provider: :func:`offline_env` points every library's
telemetry off, and :func:`loopback_only` refuses any connection or name lookup that is not
loopback while a harness runs.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import ipaddress
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import parser

from helpers.support import Proc, start_gateway, start_mock, tokenizer_dir
from tito.client.checks import sample_violations
from tito.samples import Sample, decode_samples

SYSTEM = "You are a weather bot."
TASK = 'THINK The user wants the weather: call the tool.\nCALL get_weather {"city": "Paris"}'
FOLLOW_UP = "SAY Goodbye."
MODEL_CALLS = 3
"""Model calls of the conversation: the tool call, the answer, the follow-up."""
WEATHER_DOC = "Current weather of a city."
MODEL = "qwen3"
"""The model name harnesses send (the gateway serves any name)."""
DUMMY_KEY = "sk-dummy-not-a-real-key"
VERSIONS = ("v1", "v2")
LOOSE = "v1-loose"
"""The session version of a v1 gateway run with ``--message-matcher loose_tool_call``."""


def weather(city: str) -> str:
    """The ``get_weather`` tool of every harness: its result scripts the next reply."""
    return f"sunny, 21 C in {city}\nSAY It is sunny in {city}."


# -- nothing leaves the machine ------------------------------------------------------------
OFFLINE_ENV = {
    # OpenAI Agents SDK: no trace export (it would POST to the OpenAI platform)
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    # LangChain / LangSmith: no tracing
    "LANGCHAIN_TRACING_V2": "false",
    "LANGCHAIN_TRACING": "false",
    "LANGSMITH_TRACING": "false",
    "LANGSMITH_TRACING_V2": "false",
    # litellm: the bundled cost map instead of downloading it, no telemetry
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    # mini-swe-agent: no banner, no global config in the home folder, no cost lookups
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_COST_TRACKING": "ignore_errors",
    # smolagents / huggingface_hub: no hub access
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    # any client that falls back to the environment gets a dummy key, never a real one
    "OPENAI_API_KEY": DUMMY_KEY,
    "ANTHROPIC_API_KEY": DUMMY_KEY,
}


def offline_env() -> None:
    """Set :data:`OFFLINE_ENV` (before the harness libraries are imported: some read it
    once at import)."""
    os.environ.update(OFFLINE_ENV)
    if "MSWEA_GLOBAL_CONFIG_DIR" not in os.environ:  # not the user's (it may hold keys)
        folder = tempfile.mkdtemp(prefix="mswea-")
        atexit.register(functools.partial(shutil.rmtree, folder, ignore_errors=True))
        os.environ["MSWEA_GLOBAL_CONFIG_DIR"] = folder
    for key in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        os.environ.pop(key, None)


def _loopback(host: Any) -> bool:
    if host is None:
        return True
    name = host.decode() if isinstance(host, bytes) else str(host)
    if name in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(name.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Refuse every name lookup and connection that is not loopback (an AF_UNIX socket is
    local too) while the block runs: a harness that phones home fails loudly."""
    real_getaddrinfo = socket.getaddrinfo
    real_gethostbyname = socket.gethostbyname
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def lookup(host: Any) -> None:
        if not _loopback(host):
            raise OSError(f"harness tests are offline: lookup of {host!r} refused")

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        lookup(host)
        return real_getaddrinfo(host, *args, **kwargs)

    def gethostbyname(host: str) -> str:
        lookup(host)
        return real_gethostbyname(host)

    def check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
            raise OSError(f"harness tests are offline: connection to {address!r} refused")

    def connect(self: socket.socket, address: Any) -> None:
        check(self, address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(self, address)
        return real_connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
    socket.gethostbyname = gethostbyname
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    try:
        yield
    finally:
        socket.getaddrinfo = real_getaddrinfo
        socket.gethostbyname = real_gethostbyname
        socket.socket.connect = real_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = real_connect_ex  # type: ignore[method-assign]


# -- the stack -------------------------------------------------------------------------
@dataclasses.dataclass
class HarnessStack:
    """One mock engine (qwen3) and the gateways in front of it, by session version
    (``v1``, ``v2``, :data:`LOOSE`)."""

    engine: Proc
    gateways: dict[str, Proc]

    def stop(self) -> None:
        for gateway in self.gateways.values():
            gateway.stop()
        self.engine.stop()


@contextlib.contextmanager
def harness_stack() -> Iterator[HarnessStack]:
    """``tito mock-engine`` and ``tito serve`` for qwen3 with the defaults (v1, the strict
    matcher, ``--max-rollback 1``), with ``--session-version v2``, and v1 with
    ``--message-matcher loose_tool_call`` (:data:`LOOSE`: the setting docs/harnesses.md
    gives harnesses that re-dump tool-call arguments)."""
    qwen3 = tokenizer_dir("qwen3")
    engine = start_mock(qwen3, "qwen3")
    stack = HarnessStack(engine, {})
    flags = {"v1": (), "v2": ("--session-version", "v2"),
             LOOSE: ("--message-matcher", "loose_tool_call")}
    try:
        for version, extra in flags.items():
            stack.gateways[version] = start_gateway(engine.url, qwen3, "qwen3", *extra)
        yield stack
    finally:
        stack.stop()


def turns_total(gateway_url: str) -> float:
    """``tito_turns_total`` of a gateway (every committed turn, rolled back later or not)."""
    text = httpx.get(gateway_url + "/metrics").text
    for family in parser.text_string_to_metric_families(text):
        if family.name == "tito_turns":
            return float(sum(s.value for s in family.samples if s.name == "tito_turns_total"))
    return 0.0


def errors_total(gateway_url: str, code: str) -> float:
    """``tito_errors_total`` of one error code, every status and route together."""
    text = httpx.get(gateway_url + "/metrics").text
    for family in parser.text_string_to_metric_families(text):
        if family.name == "tito_errors":
            return float(sum(s.value for s in family.samples
                             if s.name == "tito_errors_total" and s.labels.get("code") == code))
    return 0.0


# -- one trajectory --------------------------------------------------------------------
class Trajectory:
    """A session of one harness run: the URLs to give the harness, and the checks."""

    def __init__(self, stack: HarnessStack, version: str) -> None:
        self.stack = stack
        self.version = version
        self.gateway = stack.gateways[version].url
        resp = httpx.post(self.gateway + "/sessions")
        assert resp.status_code == 200, resp.text
        self.session_id: str = resp.json()["session_id"]
        self.turns_before = turns_total(self.gateway)

    @property
    def session_url(self) -> str:
        """``http://HOST/sessions/<id>``: the Anthropic SDK's base URL (it adds ``/v1``)."""
        return f"{self.gateway}/sessions/{self.session_id}"

    @property
    def openai_base_url(self) -> str:
        """``http://HOST/sessions/<id>/v1``: the OpenAI SDK's base URL."""
        return self.session_url + "/v1"

    def info(self) -> dict[str, Any]:
        resp = httpx.get(self.session_url, params={"limit": 1000})
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def engine_calls(self) -> int:
        log = httpx.get(self.stack.engine.url + "/mock/requests").json()
        return sum(1 for entry in log if entry["rid"].startswith(self.session_id))

    def samples(self) -> list[Sample]:
        resp = httpx.post(self.session_url + "/samples", json={})
        assert resp.status_code == 200, resp.text
        decoded = decode_samples(resp.content)
        assert decoded.empty_reason is None, decoded.empty_reason
        return decoded.samples

    def check(self, harness_calls: int, expected_calls: int = MODEL_CALLS) -> list[Sample]:
        """Every model call is in the samples, exactly; returns the samples.

        - the harness made the calls of the conversation (its own count), each one reached
          the engine and was committed by the gateway (``tito_turns_total``);
        - every sample is clean: no TITO violation (:func:`sample_violations`) and an
          empty ``tito_session_mismatch`` report;
        - v1: one sample whose ``num_turns`` is the call count, and as many records;
          v2: a node per call, and every node on the path of some kept sample.
        """
        assert harness_calls == expected_calls, f"the harness made {harness_calls} calls"
        assert self.engine_calls() == harness_calls
        assert turns_total(self.gateway) - self.turns_before == harness_calls
        info = self.info()
        samples = self.samples()
        for sample in samples:
            assert sample_violations(sample) == []
            assert sample.metadata["tito_session_mismatch"] == []
        if self.version.startswith("v1"):
            self._check_v1(harness_calls, info, samples)
        else:
            self._check_v2(harness_calls, info, samples)
        return samples

    @staticmethod
    def _check_v1(calls: int, info: dict[str, Any], samples: list[Sample]) -> None:
        records = [(r["turn"], r["appended_roles"], r["rolled_back"]) for r in info["records"]]
        assert len(samples) == 1
        assert samples[0].metadata["num_turns"] == calls, \
            f"{calls} calls, sample of {samples[0].metadata['num_turns']} turns; " \
            f"records (turn, appended roles, rolled back): {records}"
        assert info["page"]["total"] == calls

    @staticmethod
    def _check_v2(calls: int, info: dict[str, Any], samples: list[Sample]) -> None:
        tree = info["metadata"]["tree"]
        nodes = {node["id"] for node in tree["nodes"]}
        assert len(nodes) == calls
        kept = {int(n) for s in samples for n in s.metadata["leaf"]["path_node_ids"]}
        assert kept == nodes, f"nodes in no kept sample: {sorted(nodes - kept)}; " \
                              f"leaves: {tree['leaves']}"


def same_samples(a: list[Sample], b: list[Sample]) -> None:
    """The training content of two sample lists is identical: tokens, loss mask and
    rollout logprobs, bit for bit (metadata differs: ids and timings)."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.prompt_length == y.prompt_length
        tx, ty = x.tokens.tolist(), y.tokens.tolist()
        first = next((i for i, (p, q) in enumerate(zip(tx, ty, strict=False)) if p != q),
                     min(len(tx), len(ty)))
        assert tx == ty, f"tokens differ from position {first} ({len(tx)} vs {len(ty)} tokens)"
        assert np.array_equal(x.loss_mask, y.loss_mask)
        assert np.array_equal(x.rollout_log_probs, y.rollout_log_probs)


def cells(xfails: dict[tuple[str, str], str], variants: tuple[str, ...],
          versions: tuple[str, ...] = VERSIONS) -> list[Any]:
    """``pytest.param(variant, version)`` for every variant and session version; the
    ``(variant, version)`` cells in ``xfails`` are strict expected failures with the
    gateway behaviour that loses the turn as their reason."""
    out = []
    for variant in variants:
        for version in versions:
            reason = xfails.get((variant, version))
            marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)
                     ] if reason else []
            out.append(pytest.param(variant, version, marks=marks, id=f"{variant}-{version}"))
    return out

