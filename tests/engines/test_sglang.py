"""The SGLang client: reply validation (pure) and HTTP failure mapping (local servers).

An engine that answers garbage must surface as an :class:`EngineError` (a 502 at the
gateway), never as an unexpected exception (a 500).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from aiohttp import web

from tito.engines.sglang import SGLangEngine, parse_generate_response, sampling_payload
from tito.net import bind_tcp, url_of
from tito.types.engine import LOGPROB_TOLERANCE, SamplingParams
from tito.types.errors import (
    EngineError,
    EngineRefused,
    EngineRejected,
    EngineTimeout,
    EngineUnreachable,
)

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO.parent / "shared" / "fixtures" / "tokenizers" / "smollm2"

VALID: dict[str, Any] = {
    "text": "Hi!",
    "output_ids": [11, 12, 2],
    "meta_info": {
        "id": "r1",
        "finish_reason": {"type": "stop", "matched": 2},
        "prompt_tokens": 7,
        "weight_version": "v3",
        "completion_tokens": 3,
        "cached_tokens": 4,
        "e2e_latency": 0.25,
        "output_token_logprobs": [[-0.5, 11, "Hi"], [-1.25, 12, None], [0.0, 2]],
        "routed_experts": base64.b64encode(b"\x01\x00\x00\x00").decode(),
    },
}


def reply(**meta: Any) -> dict[str, Any]:
    """VALID with ``meta_info`` fields replaced (a value of ``...`` removes the field)."""
    data = copy.deepcopy(VALID)
    for key, value in meta.items():
        if value is ...:
            data["meta_info"].pop(key, None)
        else:
            data["meta_info"][key] = value
    return data


def parse_error(data: Any, **kw: Any) -> EngineError:
    with pytest.raises(EngineError) as info:
        parse_generate_response(data, rid="r1", **kw)
    return info.value


def protocol_error(data: Any, **kw: Any) -> EngineError:
    """The error of a malformed reply: a plain EngineError with ``engine_protocol_error``."""
    err = parse_error(data, **kw)
    assert type(err) is EngineError and err.code == "engine_protocol_error", err
    return err


# ---- parse_generate_response ---------------------------------------------------------------


def test_valid_reply() -> None:
    result = parse_generate_response(reply(), rid="r1")
    assert result.output_ids == [11, 12, 2]
    assert result.logprobs == [-0.5, -1.25, 0.0]
    assert result.finish_reason == "stop" and result.matched_stop == 2
    assert result.prompt_tokens == 7 and result.cached_tokens == 4
    assert result.weight_version == "v3" and result.e2e_latency == 0.25
    assert result.routed_experts == b"\x01\x00\x00\x00"


def test_minimal_reply_defaults() -> None:
    data = {"output_ids": [], "meta_info": {"finish_reason": {"type": "length", "length": 0},
                                            "output_token_logprobs": []}}
    result = parse_generate_response(data, rid="r1")
    assert result.output_ids == [] and result.logprobs == []
    assert result.finish_reason == "length" and result.matched_stop is None
    assert (result.prompt_tokens, result.cached_tokens) == (0, 0)
    assert result.weight_version is None and result.routed_experts is None
    assert result.e2e_latency is None


def test_mismatched_logprob_ids() -> None:
    data = reply(output_token_logprobs=[[-0.5, 11, "Hi"], [-1.25, 99, None], [0.0, 2]])
    err = protocol_error(data)
    assert "logprob entry 1 is for token 99, output_ids has 12" in str(err)


def test_logprob_count_mismatch() -> None:
    err = protocol_error(reply(output_token_logprobs=[[-0.5, 11, "Hi"]]))
    assert "1 output_token_logprobs for 3 output_ids" in str(err)


def test_missing_logprobs() -> None:
    err = protocol_error(reply(output_token_logprobs=...))
    assert "meta_info.output_token_logprobs" in str(err)


@pytest.mark.parametrize("finish", [{"type": "weird"}, "stop", None, [], {"kind": "stop"}])
def test_unknown_finish_reason(finish: Any) -> None:
    err = protocol_error(reply(finish_reason=finish))
    assert "unknown finish_reason" in str(err)


@pytest.mark.parametrize("meta", [[1, 2], None, "meta", 3])
def test_malformed_meta_info(meta: Any) -> None:
    data = copy.deepcopy(VALID)
    data["meta_info"] = meta
    err = protocol_error(data)
    assert "meta_info is" in str(err) and "not an object" in str(err)


@pytest.mark.parametrize("data", [[], "text", None, {"output_ids": [1]}])
def test_not_a_result_object(data: Any) -> None:
    assert "is not a /generate result object" in str(protocol_error(data))


@pytest.mark.parametrize("output_ids", [None, "11 12 2", {"0": 11}, 12])
def test_output_ids_not_a_list(output_ids: Any) -> None:
    data = reply()
    data["output_ids"] = output_ids
    assert "has no output_ids" in str(protocol_error(data))


@pytest.mark.parametrize("bad", ["12", 12.0, True, None, [12]])
def test_output_ids_not_token_ids(bad: Any) -> None:
    data = reply()
    data["output_ids"] = [11, bad, 2]
    assert "output_ids[1] is" in str(protocol_error(data))


@pytest.mark.parametrize("entry", [[-1.25], [-1.25, 12, None, "extra"], [], "x", None,
                                   {"logprob": -1.25, "id": 12}, 12])
def test_malformed_logprob_entry(entry: Any) -> None:
    err = protocol_error(reply(output_token_logprobs=[[-0.5, 11, "Hi"], entry, [0.0, 2]]))
    assert "output_token_logprobs[1]" in str(err)


@pytest.mark.parametrize("value", ["-1.25", [1], {"v": 1}, True, None])
def test_logprob_value_not_a_number(value: Any) -> None:
    err = protocol_error(reply(output_token_logprobs=[[-0.5, 11, "Hi"], [value, 12], [0.0, 2]]))
    assert "output_token_logprobs[1][0]" in str(err)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300, 0.5, 1, 1e-4,
                                   10**400, -(10**400)])
def test_logprob_not_a_log_probability(value: Any) -> None:
    """A logprob must be finite and <= 0 (LOGPROB_TOLERANCE aside); the error names the
    entry (slow path too)."""
    err = protocol_error(reply(output_token_logprobs=[[-0.5, 11, "Hi"], [value, 12], [0.0, 2]]))
    assert "output_token_logprobs[1][0]" in str(err)
    assert "not a log-probability (finite and <= 0)" in str(err)


@pytest.mark.parametrize("values", [[-0.0, 0.0, -1e-300], [0, -1, -2], [-1e308, -1e308, -1e308],
                                    [-0.5, LOGPROB_TOLERANCE, 2e-8]])
def test_logprob_edge_values_are_accepted(values: list[Any]) -> None:
    """0, ints, huge finite negatives (whose sum overflows the fast check) and the tiny
    positives of an engine's log-softmax rounding (as the gateway's check_output) pass."""
    rows = [[v, t] for v, t in zip(values, [11, 12, 2], strict=True)]
    result = parse_generate_response(reply(output_token_logprobs=rows), rid="r1")
    assert result.logprobs == [float(v) for v in values]
    assert all(type(v) is float for v in result.logprobs)


def test_logprob_null_is_a_protocol_error() -> None:
    """SGLang's orjson writes a NaN logprob as null: never read it as a logprob of 0."""
    err = protocol_error(reply(output_token_logprobs=[[-0.5, 11], [None, 12], [0.0, 2]]))
    assert "output_token_logprobs[1][0] is null" in str(err)


@pytest.mark.parametrize("bad", [-1, -151936])
def test_negative_output_id(bad: int) -> None:
    data = reply(output_token_logprobs=[[-0.5, 11], [-1.25, bad], [0.0, 2]])
    data["output_ids"] = [11, bad, 2]
    err = protocol_error(data)
    assert f"output_ids[1] is {bad}, a negative token id" in str(err)


def test_output_id_outside_the_vocabulary() -> None:
    data = reply(output_token_logprobs=[[-0.5, 11], [-1.25, 12], [0.0, 100]])
    data["output_ids"] = [11, 12, 100]
    assert parse_generate_response(data, rid="r1").output_ids == [11, 12, 100]  # unknown
    assert parse_generate_response(data, rid="r1", vocab_size=101).output_ids[-1] == 100
    err = protocol_error(data, vocab_size=100)
    assert "output_ids[2] is 100, outside the vocabulary (100 ids)" in str(err)


@pytest.mark.parametrize(("field", "value"), [
    ("cached_tokens", "many"), ("cached_tokens", "12"), ("cached_tokens", [1]),
    ("cached_tokens", 1.5), ("prompt_tokens", {"n": 7}), ("prompt_tokens", "seven"),
    ("weight_version", 3), ("weight_version", ["v3"]), ("e2e_latency", "fast"),
    ("routed_experts", "abc"),
])
def test_malformed_meta_fields(field: str, value: Any) -> None:
    err = protocol_error(reply(**{field: value}))
    assert f"meta_info.{field}" in str(err)


@pytest.mark.parametrize("field", ["cached_tokens", "prompt_tokens"])
def test_negative_counts(field: str) -> None:
    assert f"meta_info.{field} is int -1, not a count" in str(protocol_error(reply(**{field: -1})))


def test_malformed_matched_stop() -> None:
    err = protocol_error(reply(finish_reason={"type": "stop", "matched": [2]}))
    assert "meta_info.finish_reason.matched" in str(err)


def test_abort_with_4xx_status_is_rejected() -> None:
    finish = {"type": "abort", "message": "prompt too long", "status_code": 413,
              "err_type": "BadRequest"}
    err = parse_error(reply(finish_reason=finish, output_token_logprobs=...))
    assert isinstance(err, EngineRejected)
    assert err.engine_status == 413 and err.code == "engine_rejected"
    assert "engine aborted r1: prompt too long" in str(err)


def test_abort_with_5xx_status_is_an_engine_error() -> None:
    finish = {"type": "abort", "message": "scheduler crashed", "status_code": 503}
    err = parse_error(reply(finish_reason=finish))
    assert type(err) is EngineError and err.code == "engine_rejected"
    assert "scheduler crashed" in str(err)


def test_abort_with_a_malformed_status() -> None:
    err = protocol_error(reply(finish_reason={"type": "abort", "status_code": "500"}))
    assert "meta_info.finish_reason.status_code" in str(err)


def test_plain_abort_is_a_result() -> None:
    finish = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    data = reply(finish_reason=finish)
    data["output_ids"] = [11]
    data["meta_info"]["output_token_logprobs"] = [[-0.5, 11, None]]
    result = parse_generate_response(data, rid="r1")
    assert result.finish_reason == "abort" and result.output_ids == [11]


def test_sampling_payload_is_explicit() -> None:
    payload = sampling_payload(SamplingParams(max_new_tokens=5, stop=("x",), seed=3))
    assert payload["max_new_tokens"] == 5 and payload["stop"] == ["x"]
    assert payload["sampling_seed"] == 3 and payload["no_stop_trim"] is True
    assert "stop_token_ids" not in payload


# ---- over HTTP -----------------------------------------------------------------------------

Handler = Callable[[web.Request], Any]


@pytest.fixture
def scripted(web_server: Callable[[Any], Awaitable[str]]) -> Callable[[Handler], Awaitable[str]]:
    """A local aiohttp server whose ``/generate`` is the given handler (its URL)."""

    def start(handler: Handler) -> Awaitable[str]:
        return web_server({("POST", "/generate"): handler})

    return start


async def generate(url: str, **kw: Any) -> Any:
    engine = SGLangEngine(url, **kw)
    try:
        return await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=3), "r1")
    finally:
        await engine.close()


async def test_http_400_is_rejected_with_the_engine_status(scripted: Any) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "input is longer than the context"}},
                                 status=400)

    with pytest.raises(EngineRejected) as info:
        await generate(await scripted(handler))
    assert info.value.engine_status == 400
    assert "input is longer than the context" in str(info.value)


async def test_http_500_is_an_engine_error(scripted: Any) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="Internal Server Error", status=500)

    with pytest.raises(EngineError) as info:
        await generate(await scripted(handler))
    assert not isinstance(info.value, EngineRejected)
    assert info.value.code == "engine_error"
    assert "HTTP 500" in str(info.value) and "Internal Server Error" in str(info.value)


async def test_non_json_body_is_an_engine_error(scripted: Any) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="<html>gateway</html>", content_type="text/html")

    with pytest.raises(EngineError, match="is not JSON") as info:
        await generate(await scripted(handler))
    assert info.value.code == "engine_protocol_error"
    assert isinstance(info.value.__cause__, orjson.JSONDecodeError)


async def test_garbage_json_is_an_engine_error(scripted: Any) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"output_ids": [1], "meta_info": [1]})

    with pytest.raises(EngineError, match="meta_info is list") as info:
        await generate(await scripted(handler))
    assert info.value.code == "engine_protocol_error"


async def test_valid_reply_over_http(scripted: Any) -> None:
    seen: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response(reply())

    result = await generate(await scripted(handler))
    assert result.output_ids == [11, 12, 2] and result.e2e_latency == 0.25
    body = seen[0]
    assert body["input_ids"] == [1, 2, 3] and body["rid"] == "r1"
    assert body["return_logprob"] is True and body["stream"] is False


async def test_a_session_s_next_prompt_is_spliced_onto_the_previous_one(scripted: Any) -> None:
    """The second turn of a session serializes only its new ids; the body is the same."""
    seen: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.json_response(reply())

    engine = SGLangEngine(await scripted(handler))
    prompts = [[1, 2, 3], [1, 2, 3, 11, 12, 2, 7, 8], [1, 2, 9]]  # grow, then roll back
    try:
        for turn, prompt in enumerate(prompts):
            await engine.generate(np.asarray(prompt, dtype=np.int32),
                                  SamplingParams(max_new_tokens=3), f"sess_t{turn:06d}_ab")
    finally:
        await engine.close()
    assert [orjson.loads(body)["input_ids"] for body in seen] == prompts
    assert [orjson.loads(body)["rid"] for body in seen] == [
        "sess_t000000_ab", "sess_t000001_ab", "sess_t000002_ab"]
    assert engine.prompt_json.reused == 1  # the second prompt; the third is a rollback


async def test_requests_in_flight_set_the_prompt_cache_budget(scripted: Any) -> None:
    """Every /generate (answered, refused, streamed) is counted in flight while it runs."""
    release = asyncio.Event()
    arrived = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal arrived
        body = await request.json()
        arrived += 1
        await release.wait()
        if body["rid"].startswith("bad"):
            return web.json_response({"error": "no"}, status=400)
        if body["stream"]:
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: " + orjson.dumps(reply()) + b"\n\ndata: [DONE]\n\n")
            return resp
        return web.json_response(reply())

    engine = SGLangEngine(await scripted(handler))

    async def stream(rid: str) -> None:
        async for _ in engine.generate_stream([1, 2], SamplingParams(max_new_tokens=3), rid):
            pass

    try:
        calls = [engine.generate([1, 2], SamplingParams(max_new_tokens=3), f"s{i}_t000000_ab")
                 for i in range(3)]
        tasks = [asyncio.ensure_future(c) for c in
                 [*calls, stream("st_t000000_ab"),
                  engine.generate([1], SamplingParams(max_new_tokens=3), "bad_t000000_ab")]]
        while arrived < 5:
            await asyncio.sleep(0.01)
        assert engine.prompt_json.in_flight == 5
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await engine.close()
    assert isinstance(results[-1], EngineRejected)
    assert engine.prompt_json.in_flight == 0 and engine.prompt_json.peak_in_flight == 5


async def test_connection_refused_is_an_engine_error() -> None:
    sock = bind_tcp("127.0.0.1", 0)
    url = url_of(sock)
    sock.close()  # nothing listens there any more
    with pytest.raises(EngineError, match="transport error") as info:
        await generate(url)
    # nothing was sent: an engine pool moves the request at once (a single engine: 502)
    assert type(info.value) is EngineRefused and info.value.code == "engine_error"
    assert isinstance(info.value, EngineUnreachable) and info.value.__cause__ is not None


async def test_timeout_is_an_engine_timeout(scripted: Any) -> None:
    async def handler(request: web.Request) -> web.Response:
        await asyncio.sleep(0.3)
        return web.json_response(reply())

    with pytest.raises(EngineTimeout, match="timed out") as info:
        await generate(await scripted(handler), timeout=0.05)
    assert info.value.code == "engine_timeout"


@pytest.mark.skipif(not SMOLLM2.is_dir(), reason=f"needs the fixture tokenizer {SMOLLM2}")
async def test_against_the_mock_engine() -> None:
    """The client and ``tito.engines.mock`` agree on the wire format (in-process uvicorn)."""
    import uvicorn

    from tito.engines.mock import MockConfig, build_engine

    mock = build_engine(MockConfig(tokenizer_dir=str(SMOLLM2), family="chatml",
                                   context_length=64, weight_version="w1"))
    sock = bind_tcp("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(mock.app(), log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    engine = SGLangEngine(url_of(sock))
    try:
        while not server.started:
            assert not task.done(), "the mock did not start"
            await asyncio.sleep(0.005)
        prompt = mock.tokenizer.encode(
            "<|im_start|>user\nSAY hello there<|im_end|>\n<|im_start|>assistant\n")
        result = await engine.generate(prompt, SamplingParams(max_new_tokens=20), "m1")
        assert mock.tokenizer.decode(result.output_ids).startswith("hello there")
        assert result.finish_reason == "stop" and result.matched_stop == result.output_ids[-1]
        assert len(result.logprobs) == len(result.output_ids)
        assert all(lp < 0 for lp in result.logprobs)
        assert result.prompt_tokens == len(prompt) and result.weight_version == "w1"
        assert await engine.context_length() == 64
        with pytest.raises(EngineRejected, match="context length") as info:
            await engine.generate(list(range(1, 60)), SamplingParams(max_new_tokens=20), "m2")
        assert info.value.engine_status == 400
    finally:
        await engine.close()
        server.should_exit = True
        await task
        sock.close()
