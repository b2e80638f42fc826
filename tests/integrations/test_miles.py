"""``tito.integrations.miles``: the reference framework's two generate-function forms and
its loader, run end to end against ``tito serve`` + ``tito mock-engine`` (real processes)
with agents in the framework's contract and stand-ins of its types (``miles_standins``).
"""

from __future__ import annotations

import argparse
import asyncio
from argparse import Namespace
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from helpers import miles_standins as fw
from helpers.support import Proc, start_gateway, tokenizer_dir

from tito.client.agent import REQUEST_FIELDS, generate
from tito.client.tracer import CollectError, SessionTracer
from tito.integrations import miles
from tito.samples import Sample
from tito.server.openai.models import ChatCompletionRequest

pytestmark = pytest.mark.slow  # real gateway and mock processes (fast tier under a minute)

SAMPLING = {"max_new_tokens": 48, "temperature": 0.0, "skip_special_tokens": False,
            "no_stop_trim": True, "sampling_seed": 7, "top_k": None}


@pytest.fixture(autouse=True)
def clean_standins() -> Iterator[None]:
    fw.calls.clear()
    fw.aborts.clear()
    fw.after_turn.clear()
    yield
    fw.after_turn.clear()


@pytest.fixture(scope="module")
def v2_gateway(qwen3_stack: tuple[Proc, Proc]) -> Iterator[Proc]:
    """A second gateway, ``--session-version v2``, in front of the same mock engine."""
    engine, _ = qwen3_stack
    gateway = start_gateway(engine.url, tokenizer_dir("qwen3"), "qwen3",
                            "--session-version", "v2")
    try:
        yield gateway
    finally:
        gateway.stop()


def args_for(url: str, agent: str, **extra: Any) -> Namespace:
    return Namespace(tito_url=url, custom_agent_function_path=f"helpers.miles_standins.{agent}",
                     **extra)


def input_sample(**fields: Any) -> fw.Sample:
    return fw.Sample(prompt=[{"role": "user", "content": "Hello?\nSAY Hi."}],
                     metadata={"id": "q1"}, **fields)


def new_form_input(args: Namespace, sample: fw.Sample) -> fw.GenerateFnInput:
    return fw.GenerateFnInput(fw.GenerateState(args), sample, dict(SAMPLING), False)


# -- settings, flags, request kwargs ---------------------------------------------------------
def test_request_kwargs_use_openai_names_and_drop_engine_only_ones() -> None:
    assert miles.request_kwargs(SAMPLING) == {"max_tokens": 48, "temperature": 0.0, "seed": 7}
    # an explicit OpenAI name wins over the framework's
    assert miles.request_kwargs({"max_new_tokens": 8, "max_tokens": 16}) == {"max_tokens": 16}
    # every field kept is one the gateway's chat request model knows
    assert REQUEST_FIELDS <= set(ChatCompletionRequest.model_fields)


def test_settings_come_from_args_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(miles.ENV_URL, raising=False)
    with pytest.raises(ValueError, match="--tito-url URL or set TITO_URL"):
        miles.settings_from_args(Namespace(custom_agent_function_path="a.b"))
    monkeypatch.setenv(miles.ENV_URL, "http://h1:1/, http://h2:2")
    settings = miles.settings_from_args(Namespace(custom_agent_function_path="a.b",
                                                  max_seq_len=4096))
    assert settings.urls == ("http://h1:1", "http://h2:2")
    assert settings.max_seq_len == 4096 and settings.timeout == miles.DEFAULT_TIMEOUT
    with pytest.raises(ValueError, match="http"):
        miles.settings_from_args(Namespace(tito_url="h1:1", custom_agent_function_path="a.b"))
    with pytest.raises(ValueError, match="--custom-agent-function-path"):
        miles.settings_from_args(Namespace(tito_url="http://h:1"))
    with pytest.raises(ValueError, match="--max-seq-len"):
        miles.settings_from_args(Namespace(tito_url="http://h:1",
                                           custom_agent_function_path="a.b", max_seq_len=1))
    with pytest.raises(ValueError, match="--tito-lifecycle"):
        miles.settings_from_args(Namespace(tito_url="http://h:1",
                                           custom_agent_function_path="a.b",
                                           tito_lifecycle="later"))
    assert settings.lifecycle == "finish"


def test_session_options_carry_evaluation_and_the_sampling_defaults() -> None:
    assert miles.session_options(SAMPLING, True) == {"evaluation": True, "temperature": 0.0}
    assert miles.session_options({"top_p": 0.9, "top_k": 20}, False) == {
        "evaluation": False, "top_p": 0.9, "top_k": 20}


def test_add_arguments_keeps_flags_the_framework_defines() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-seq-len", type=int, default=123)
    miles.generate.add_arguments(parser)  # type: ignore[attr-defined]
    args = parser.parse_args(["--tito-url", "http://h:1", "--custom-agent-function-path",
                              "pkg.agent.run", "--tito-timeout", "30"])
    assert args.tito_url == "http://h:1" and args.custom_agent_function_path == "pkg.agent.run"
    assert args.tito_timeout == 30.0 and args.max_seq_len == 123


def test_agent_paths_in_every_form() -> None:
    fn, abort = miles.load_agent_function("helpers.miles_standins.weather")
    assert fn is fw.weather and abort is fw.abort
    assert miles.load_agent_function("helpers.miles_standins:silent")[0] is fw.silent
    with pytest.raises(ValueError, match=r"--custom-agent-function-path.*has no attribute"):
        miles.load_agent_function("helpers.miles_standins.nope")
    with pytest.raises(ValueError, match=r"module\.function"):
        miles.load_agent_function("weather")


# -- the loader --------------------------------------------------------------------------------
async def legacy_plain(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    return [sample, sample]


async def legacy_with_evaluation(args: Any, sample: Any, sampling_params: dict[str, Any],
                                 evaluation: bool = False) -> Any:
    sample.metadata["evaluation"] = evaluation
    return miles.GenerateOutput(samples=sample)


async def new_form(input: Any) -> Any:
    return miles.GenerateOutput(samples=input.sample)


class GenerateClass:
    async def __call__(self, input: Any) -> Any:
        return miles.GenerateOutput(samples="from a class")


async def test_loader_adapts_the_legacy_form() -> None:
    name = __name__
    assert miles.load_generate_function("") is None
    assert miles.load_generate_function(f"{name}.new_form") is new_form
    assert isinstance(miles.load_generate_function(f"{name}:GenerateClass"), GenerateClass)
    assert miles.is_legacy_generate_function(miles.generate_legacy)
    assert not miles.is_legacy_generate_function(miles.generate)

    sample = input_sample()
    item = fw.GenerateFnInput(fw.GenerateState(Namespace()), sample, {}, True)
    plain = miles.load_generate_function(f"{name}.legacy_plain")
    assert isinstance(plain, miles.LegacyGenerateAdapter)
    out = await plain(item)
    assert isinstance(out, miles.GenerateOutput) and out.samples == [sample, sample]
    with_eval = miles.load_generate_function(f"{name}.legacy_with_evaluation")
    assert with_eval is not None
    out = await with_eval(item)  # an output object passes through, evaluation is passed
    assert out.samples is sample and sample.metadata["evaluation"] is True


# -- end to end: the new form on a v1 session ------------------------------------------------
@pytest.mark.parametrize("lifecycle", miles.LIFECYCLES)
async def test_new_form_v1_gives_one_framework_sample(qwen3_stack: tuple[Proc, Proc],
                                                      lifecycle: str) -> None:
    """Both lifecycles (finish -> samples -> delete; samples -> delete) give the sample
    tito's own tracer collects."""
    engine, gateway = qwen3_stack
    httpx.delete(engine.url + "/mock/requests")
    args = args_for(gateway.url, "weather", max_seq_len=4096, tito_lifecycle=lifecycle)
    sample = input_sample(index=3)
    out = await miles.generate(new_form_input(args, sample))

    assert isinstance(out, miles.GenerateOutput)  # the framework is absent here
    got = out.samples
    assert isinstance(got, fw.Sample) and got is not sample
    assert sample.tokens == [] and sample.status is fw.Sample.Status.PENDING  # input untouched
    assert got.status is fw.Sample.Status.COMPLETED
    assert isinstance(got.prefix_cache_info, fw.Sample.PrefixCacheInfo)
    assert got.prefix_cache_info.total_prompt_tokens > 0
    assert type(got.tokens) is list and type(got.loss_mask) is list
    assert type(got.rollout_log_probs) is list
    assert len(got.loss_mask) == len(got.rollout_log_probs) == got.response_length > 0
    assert got.rollout_id is None and got.rollout_routed_experts is None
    assert got.non_generation_time == 0.25
    meta = got.metadata
    assert meta["id"] == "q1" and meta["answer_checked"] is True
    assert meta["session_version"] == "v1"
    assert meta["num_turns"] == 7  # nine requests, two of them retries
    assert meta["session_server_id"] == gateway.url.split("://")[1]
    assert meta["session_server_instance_id"] == meta["instance_id"]
    assert meta["turn_in_progress"] is False  # the session metadata, merged on v1

    (call,) = fw.calls
    assert call["base_url"].startswith(gateway.url + "/sessions/")
    assert call["prompt"] == sample.prompt
    assert call["request_kwargs"] == {"max_tokens": 48, "temperature": 0.0, "seed": 7}
    assert call["metadata"]["max_seq_len"] == 4096 and call["metadata"]["id"] == "q1"
    assert call["metadata"]["session_server_instance_id"] == meta["instance_id"]
    sent = httpx.get(engine.url + "/mock/requests").json()
    assert {r["sampling_params"]["max_new_tokens"] for r in sent} == {48}
    gone = httpx.get(call["base_url"])
    assert gone.status_code == 410  # deleted after the collection

    # the same agent through tito's own client gives the same trajectory, bit for bit
    async with SessionTracer(gateway.url) as tracer:
        (ours,) = await generate(fw.weather, sample.prompt,
                                 {"max_new_tokens": 48, "temperature": 0.0, "seed": 7},
                                 tracer=tracer)
    assert_same_data(got, ours)


def assert_same_data(got: fw.Sample, ours: Sample) -> None:
    assert got.tokens == ours.tokens.tolist()
    assert got.loss_mask == ours.loss_mask.tolist()  # type: ignore[union-attr]
    np.testing.assert_array_equal(got.rollout_log_probs, ours.rollout_log_probs)  # type: ignore[arg-type]
    assert got.response == ours.response and got.response_length == ours.response_length


# -- end to end: the legacy form on a v2 session -----------------------------------------
async def test_legacy_form_v2_gives_a_list_sharing_the_rollout_id(v2_gateway: Proc) -> None:
    args = Namespace(tito_url=v2_gateway.url,
                     custom_agent_function_path="helpers.branching_agent.run_agent")
    sample = input_sample(index=11)
    got = await miles.generate_legacy(args, sample, dict(SAMPLING))
    assert isinstance(got, list) and len(got) == 2  # the two kept leaves
    assert {s.rollout_id for s in got} == {11}
    assert all(s.status is fw.Sample.Status.COMPLETED and s.reward == 1.0 for s in got)
    assert got[0].metadata["branches"] == 2 and got[0].metadata["leaf"]["node_id"] == 3
    assert "turn_in_progress" not in got[0].metadata  # v2: per-leaf metadata only

    # the same function through the loader, in the new form
    adapted = miles.load_generate_function("tito.integrations.miles.generate_legacy")
    assert isinstance(adapted, miles.LegacyGenerateAdapter)
    out = await adapted(new_form_input(args, input_sample(rollout_id=5, index=11)))
    assert isinstance(out, miles.GenerateOutput) and {s.rollout_id for s in out.samples} == {5}


@pytest.mark.parametrize("option", miles.V2_REFUSED)
async def test_options_that_need_one_sample_are_refused_on_v2(
        v2_gateway: Proc, qwen3_stack: tuple[Proc, Proc], option: str) -> None:
    flag = "--" + option.replace("_", "-")
    with pytest.raises(ValueError, match=f"{flag} is not supported with the v2 sessions"):
        await miles.generate_legacy(args_for(v2_gateway.url, "weather", **{option: True}),
                                    input_sample(), dict(SAMPLING))
    assert fw.calls == []  # refused before any session exists
    _, v1_gateway = qwen3_stack  # v1 returns one sample: allowed
    got = await miles.generate_legacy(args_for(v1_gateway.url, "silent", **{option: True}),
                                      input_sample(), {})
    assert got.metadata["aborted_reason"] == "empty: no_records"


async def test_v2_single_sample_keeps_no_rollout_id(v2_gateway: Proc) -> None:
    out = await miles.generate(new_form_input(args_for(v2_gateway.url, "weather"),
                                              input_sample(index=2)))
    (got,) = out.samples  # a list on v2, even with one sample
    assert got.rollout_id is None and got.status is fw.Sample.Status.COMPLETED


# -- failures ---------------------------------------------------------------------------------
async def test_an_agent_that_raises_gives_an_incomplete_snapshot(
        qwen3_stack: tuple[Proc, Proc]) -> None:
    """The finish lifecycle: an agent that raised did not finish (the reference's rule)."""
    _, gateway = qwen3_stack
    got = await miles.generate_legacy(args_for(gateway.url, "one_turn_then_raise"),
                                      input_sample(), dict(SAMPLING))
    assert got.status is fw.Sample.Status.ABORTED and got.tokens == []
    assert got.metadata["aborted_reason"] == "empty: incomplete"
    (call,) = fw.calls
    assert (await asyncio.to_thread(httpx.get, call["base_url"])).status_code == 410


async def test_an_instrumented_agent_result_decides_completeness(
        qwen3_stack: tuple[Proc, Proc]) -> None:
    """The framework's newer ``AgentResult(metadata, producer_finished)`` from an agent
    that registers its context and sends identity headers: its metadata is merged, and
    ``producer_finished=False`` makes the snapshot incomplete (an aborted copy)."""
    _, gateway = qwen3_stack
    done = await miles.generate_legacy(args_for(gateway.url, "instrumented"),
                                       input_sample(), dict(SAMPLING))
    assert done.status is fw.Sample.Status.COMPLETED and done.metadata["reward"] == 1.0
    assert done.metadata["harness"] == "instrumented"
    assert done.metadata["context_id"] == "main-1" and "agent_error" not in done.metadata
    unfinished = await miles.generate_legacy(args_for(gateway.url, "instrumented_unfinished"),
                                             input_sample(), dict(SAMPLING))
    assert unfinished.status is fw.Sample.Status.ABORTED
    assert unfinished.metadata["aborted_reason"] == "empty: incomplete"


async def test_an_agent_that_raises_still_has_its_turns_collected(
        qwen3_stack: tuple[Proc, Proc]) -> None:
    """The samples lifecycle collects the committed turns of an agent that raised."""
    _, gateway = qwen3_stack
    got = await miles.generate_legacy(
        args_for(gateway.url, "one_turn_then_raise", tito_lifecycle="samples"),
        input_sample(), dict(SAMPLING))
    assert got.status is fw.Sample.Status.COMPLETED and got.metadata["num_turns"] == 1
    assert got.metadata["agent_error"] == "RuntimeError: the tool sandbox crashed"
    assert got.response.endswith("Hi.<|im_end|>")


async def test_no_model_call_gives_an_aborted_copy(qwen3_stack: tuple[Proc, Proc]) -> None:
    _, gateway = qwen3_stack
    sample = input_sample()
    got = await miles.generate_legacy(args_for(gateway.url, "silent"), sample, {})
    assert got.status is fw.Sample.Status.ABORTED and got.tokens == []
    assert got.metadata == {"id": "q1", "aborted_reason": "empty: no_records",
                            "session_server_id": gateway.url.split("://")[1]}
    assert got.prompt == sample.prompt


async def test_everything_truncated_gives_an_aborted_copy(
        qwen3_stack: tuple[Proc, Proc]) -> None:
    _, gateway = qwen3_stack
    got = await miles.generate_legacy(args_for(gateway.url, "weather", max_seq_len=2),
                                      input_sample(), dict(SAMPLING))
    assert got.status is fw.Sample.Status.ABORTED
    assert got.metadata["aborted_reason"] == "empty: all_truncated"


async def test_a_gateway_error_reply_raises(qwen3_stack: tuple[Proc, Proc]) -> None:
    _, gateway = qwen3_stack
    with pytest.raises(RuntimeError, match="failed with 410"):
        await miles.generate_legacy(args_for(gateway.url, "delete_own_session"),
                                    input_sample(), dict(SAMPLING))


async def test_cancellation_calls_the_abort_hook_once_and_deletes_the_sessions(
        qwen3_stack: tuple[Proc, Proc]) -> None:
    _, gateway = qwen3_stack
    args = args_for(gateway.url, "one_turn_then_hang")
    tasks = [asyncio.create_task(miles.generate_legacy(args, input_sample(), dict(SAMPLING)))
             for _ in range(2)]
    async with httpx.AsyncClient() as http:
        for _ in range(400):  # until both agents have their turn committed
            turns = [(await http.get(c["base_url"])).json()["metadata"]["num_turns"]
                     for c in fw.calls]
            if turns == [1, 1]:
                break
            await asyncio.sleep(0.02)
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        assert fw.aborts == [args]  # one call for the burst, with the framework's args
        for call in fw.calls:
            assert (await http.get(call["base_url"])).status_code == 410


@pytest.mark.slow
async def test_a_collect_that_loses_the_gateway_gives_an_aborted_copy(
        qwen3_stack: tuple[Proc, Proc]) -> None:
    engine, _ = qwen3_stack
    gateway = start_gateway(engine.url, tokenizer_dir("qwen3"), "qwen3")
    fw.after_turn.append(gateway.stop)
    try:
        got = await miles.generate_legacy(args_for(gateway.url, "one_turn_then_raise"),
                                          input_sample(), dict(SAMPLING))
    finally:
        gateway.stop()
    assert got.status is fw.Sample.Status.ABORTED and got.tokens == []
    assert got.metadata["aborted_reason"].startswith("collect failed: ConnectError")


@pytest.mark.slow
async def test_session_creation_waits_while_the_gateway_is_full(
        qwen3_stack: tuple[Proc, Proc]) -> None:
    engine, _ = qwen3_stack
    gateway = start_gateway(engine.url, tokenizer_dir("qwen3"), "qwen3", "--max-sessions", "1")
    try:
        async with httpx.AsyncClient() as http:
            held = (await http.post(gateway.url + "/sessions")).json()["session_id"]
            task = asyncio.create_task(miles.generate_legacy(
                args_for(gateway.url, "silent"), input_sample(), {}))
            await asyncio.sleep(1.5)
            assert not task.done() and fw.calls == []  # 429 too_many_sessions: waiting
            await http.delete(f"{gateway.url}/sessions/{held}")
            got = await task
        assert got.metadata["aborted_reason"] == "empty: no_records" and len(fw.calls) == 1
        with pytest.raises(CollectError, match="failed with 404"):  # not retried
            await miles.create_session(SessionTracer(gateway.url + "/nope"), 5.0)
    finally:
        gateway.stop()


def test_overlay_carries_sampling_masks_only_when_present() -> None:
    """``--sampling-mask-replay`` samples hand the framework their kept ids and offsets;
    without them the template gets no such attribute."""
    base = {"tokens": np.array([1, 2, 3], np.int64), "response_length": 2,
            "loss_mask": np.array([1, 1], np.uint8),
            "rollout_log_probs": np.array([-0.5, -0.25], np.float64)}
    masked = Sample(**base, rollout_sampling_mask=np.array([2, 9, 3], np.int32),
                    rollout_sampling_mask_offsets=np.array([0, 2, 3], np.int64))
    got = miles.overlay(masked, fw.Sample())
    assert got.rollout_sampling_mask.tolist() == [2, 9, 3]
    assert got.rollout_sampling_mask_offsets.tolist() == [0, 2, 3]
    assert not hasattr(miles.overlay(Sample(**base), fw.Sample()), "rollout_sampling_mask")
