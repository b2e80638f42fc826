"""SGLang's two stream modes read by :class:`StreamAssembler` (chunks written as SGLang's
orjson writes them), and the SSE reader of the engine clients: lines of any size, linear
work; the new ids of every chunk are checked."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tito.engines.sglang import SGLangEngine
from tito.engines.sglang_stream import StreamAssembler
from tito.engines.transport import sse_data
from tito.types.engine import GenerateResult, SamplingParams, check_stream_ids
from tito.types.errors import EngineError

VOCAB = 1000


def ids_of(n: int) -> list[int]:
    return [(7 * i + 3) % VOCAB for i in range(n)]


def lp_of(n: int) -> list[float]:
    return [-0.5 - (i % 7) / 8 for i in range(n)]


def chunk(ids: list[int], logprobs: list[float], *, done: int, final: bool = False,
          text: str = "") -> bytes:
    """A ``/generate`` stream chunk as SGLang writes it (its key order)."""
    meta: dict[str, Any] = {
        "id": "r", "finish_reason": {"type": "length", "length": done} if final else None,
        "prompt_tokens": 3, "weight_version": "default", "num_retractions": 0,
        "output_token_logprobs": [[lp, tok, None] for lp, tok in zip(logprobs, ids,
                                                                      strict=True)],
        "output_token_logprobs_length": len(ids), "reasoning_tokens": 0,
        "completion_tokens": done, "cached_tokens": 0}
    return orjson.dumps({"text": text, "output_ids": ids, "meta_info": meta})


def cumulative(n: int, step: int) -> list[bytes]:
    ids, lps = ids_of(n), lp_of(n)
    cuts = list(range(step, n, step))
    out = [chunk(ids[:k], lps[:k], done=k, text="x" * k) for k in cuts]
    return [*out, chunk(ids, lps, done=n, final=True, text="x" * n)]


def incremental(n: int, step: int) -> list[bytes]:
    ids, lps = ids_of(n), lp_of(n)
    cuts = [*range(step, n, step), n]
    out, prev = [], 0
    for k in cuts:
        out.append(chunk(ids[prev:k], lps[prev:k], done=k, final=k == n))
        prev = k
    return out


def run(chunks: list[bytes], vocab: int | None = VOCAB) -> tuple[StreamAssembler,
                                                                  GenerateResult]:
    asm = StreamAssembler("r", vocab)
    for data in chunks[:-1]:
        out = asm.feed(data)
        assert out is None or isinstance(out, list)
    result = asm.feed(chunks[-1])
    assert isinstance(result, GenerateResult)
    return asm, result


@pytest.mark.parametrize("step", [1, 3, 50])
@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_both_modes_assemble_the_whole_result(mode: str, step: int) -> None:
    n = 200
    asm, result = run((cumulative if mode == "cumulative" else incremental)(n, step))
    assert result.output_ids == ids_of(n) and result.logprobs == lp_of(n)
    assert result.finish_reason == "length" and result.checked is not None
    assert result.checked.ids.tolist() == ids_of(n)
    assert asm.mode == mode
    if mode == "cumulative":  # all but the first two chunks and the final: tail only
        assert asm.fast_chunks == max(0, len(range(step, n, step)) - 2)


def test_each_chunk_gives_the_ids_so_far_in_one_list() -> None:
    asm = StreamAssembler("r", VOCAB)
    seen = []
    for data in cumulative(20, 4)[:-1]:
        out = asm.feed(data)
        assert out is asm.ids  # grown in place, not copied
        seen.append(len(out))
    assert seen == [4, 8, 12, 16]


def test_a_single_final_chunk_is_the_whole_reply() -> None:
    _, result = run([chunk(ids_of(5), lp_of(5), done=5, final=True)])
    assert result.output_ids == ids_of(5)


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
@pytest.mark.parametrize("bad", [VOCAB, -1, 2**31])
def test_a_bad_id_in_a_middle_chunk_fails_that_chunk(mode: str, bad: int) -> None:
    n = 40
    chunks = (cumulative if mode == "cumulative" else incremental)(n, 4)
    spoiled = chunks[5].replace(b",%d," % ids_of(n)[21], b",%d," % bad, 1)
    spoiled = spoiled.replace(b",%d,null]" % ids_of(n)[21], b",%d,null]" % bad, 1)
    assert spoiled != chunks[5]
    asm = StreamAssembler("r", VOCAB)
    for data in chunks[:5]:
        asm.feed(data)
    with pytest.raises(EngineError) as info:
        asm.feed(spoiled)
    assert info.value.code == "engine_protocol_error" and str(bad) in str(info.value)


def test_a_huge_id_is_a_protocol_error_without_a_vocabulary() -> None:
    with pytest.raises(EngineError, match="largest token id") as info:
        run([chunk([5, 2**31], [-0.1, -0.2], done=2, final=True)], vocab=None)
    assert info.value.code == "engine_protocol_error"


def test_a_bad_logprob_in_a_middle_chunk_fails_it() -> None:
    chunks = cumulative(30, 5)
    asm = StreamAssembler("r", VOCAB)
    for data in chunks[:3]:
        asm.feed(data)
    spoiled = chunk(ids_of(20), [*lp_of(19), 3.0], done=20)
    with pytest.raises(EngineError, match="log-probability"):
        asm.feed(spoiled)


def test_a_final_chunk_that_does_not_extend_the_stream_fails() -> None:
    chunks = cumulative(12, 4)
    other = [*ids_of(12)[:3], 999, *ids_of(12)[4:]]
    asm = StreamAssembler("r", VOCAB)
    for data in chunks[:-1]:
        asm.feed(data)
    with pytest.raises(EngineError, match="does not extend"):
        asm.feed(chunk(other, lp_of(12), done=12, final=True))


def test_chunks_that_are_neither_mode_fail() -> None:
    asm = StreamAssembler("r", VOCAB)
    asm.feed(chunk(ids_of(4), lp_of(4), done=4))
    with pytest.raises(EngineError, match="neither"):
        asm.feed(chunk(ids_of(3), lp_of(3), done=9))


def test_an_error_event_is_an_engine_error() -> None:
    asm = StreamAssembler("r", VOCAB)
    asm.feed(chunk(ids_of(4), lp_of(4), done=4))
    with pytest.raises(EngineError, match="engine stream error: boom"):
        asm.feed(orjson.dumps({"error": {"message": "boom", "type": "x"}}))


def test_another_key_order_is_read_whole() -> None:
    """A chunk the tail reader cannot place (meta_info first) is parsed whole."""
    asm = StreamAssembler("r", VOCAB)
    n = 30
    for k in (5, 10, 15, 20):
        data = orjson.loads(chunk(ids_of(k), lp_of(k), done=k))
        asm.feed(orjson.dumps({"meta_info": data["meta_info"], "output_ids": data["output_ids"]}))
    result = asm.feed(chunk(ids_of(n), lp_of(n), done=n, final=True))
    assert isinstance(result, GenerateResult) and result.output_ids == ids_of(n)


def test_check_stream_ids_checks_the_new_ids_only() -> None:
    ids = [1, 2, VOCAB + 5]
    assert check_stream_ids(ids, 3, VOCAB) == 3  # already checked
    with pytest.raises(EngineError, match=r"output_ids\[2\]"):
        check_stream_ids(ids, 1, VOCAB)


# -- the SSE reader --------------------------------------------------------------------
async def read_all(url: str) -> list[bytes]:
    async with aiohttp.ClientSession() as session, session.post(url) as resp:
        return [data async for data in sse_data(resp.content)]


async def test_sse_lines_of_any_size_in_small_pieces(
        web_server: Callable[[Any], Awaitable[str]]) -> None:
    big = b"x" * (3 << 20)  # 3 MiB: over aiohttp's 512 KiB line limit

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        body = b"data: 1\n\n: comment\ndata:2\r\n\r\ndata: " + big + b"\n\ndata: [DONE]\n\n"
        for at in range(0, len(body), 1000):  # 1000-byte pieces
            await resp.write(body[at:at + 1000])
        return resp

    url = await web_server({("POST", "/s"): handler})
    assert await read_all(url + "/s") == [b"1", b"2", big, b"[DONE]"]


async def test_a_line_over_the_limit_is_a_protocol_error(
        web_server: Callable[[Any], Awaitable[str]]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + b"y" * 5000)
        return resp

    url = await web_server({("POST", "/s"): handler})
    async with aiohttp.ClientSession() as session, session.post(url + "/s") as resp:
        with pytest.raises(EngineError) as info:
            _ = [d async for d in sse_data(resp.content, limit=1000)]
    assert info.value.code == "engine_protocol_error"


async def served_stream(web_server: Callable[[Any], Awaitable[str]],
                        chunks: list[bytes]) -> str:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for data in chunks:
            await resp.write(b"data: " + data + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    return await web_server({("POST", "/generate"): handler})


async def collect(engine: SGLangEngine) -> AsyncIterator[tuple[int, bool]]:
    async for c in engine.generate_stream([1, 2, 3], SamplingParams(max_new_tokens=9), "r"):
        yield len(c.output_ids), c.result is not None


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
async def test_the_client_streams_a_long_turn_in_either_mode(
        web_server: Callable[[Any], Awaitable[str]], mode: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """20k ids: cumulative chunks past 512 KiB go through; the client yields the ids so far
    after every chunk and the whole result last; a long cumulative stream logs (once) that
    SGLang's incremental streaming would cost less."""
    n = 20000
    chunks = (cumulative if mode == "cumulative" else incremental)(n, 2500)
    engine = SGLangEngine(await served_stream(web_server, chunks), vocab_size=VOCAB)
    try:
        got = [x async for x in collect(engine)]
        again = [x async for x in collect(engine)]
    finally:
        await engine.close()
    assert got == again == [(k, False) for k in range(2500, n, 2500)] + [(n, True)]
    hints = [r for r in caplog.records if "--incremental-streaming-output" in r.getMessage()]
    assert len(hints) == (1 if mode == "cumulative" else 0)


def test_cumulative_chunks_are_decoded_in_linear_total_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk k of a cumulative stream is k ids long (quadratic bytes in all); the JSON
    the assembler decodes adds up to a few times the final reply's size: linear."""
    import tito.engines.sglang_stream as module

    decoded = 0
    real_loads = orjson.loads

    def counting_loads(data: Any) -> Any:
        nonlocal decoded
        decoded += len(data)
        return real_loads(data)

    class Counting:
        loads = staticmethod(counting_loads)
        JSONDecodeError = orjson.JSONDecodeError

    monkeypatch.setattr(module, "orjson", Counting)
    n = 1500
    chunks = cumulative(n, 1)
    run(chunks)
    sent = sum(map(len, chunks))
    assert decoded < 4 * len(chunks[-1]) and sent > n // 3 * len(chunks[-1])
