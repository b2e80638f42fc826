"""`tito mock-engine`: a real subprocess driven over HTTP, checked against SGLang's wire format."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tito.engines.mock import RadixCache
from tito.engines.mock.directives import parse_directives
from tito.render import build_renderer

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
TOKENIZERS = SHARED / "fixtures" / "tokenizers"

pytestmark = pytest.mark.skipif(
    not (TOKENIZERS / "qwen3").is_dir() or not (TOKENIZERS / "smollm2").is_dir(),
    reason=f"needs the fixture tokenizers in {TOKENIZERS} (../shared is absent)",
)

QWEN_STOP = 151645  # <|im_end|>
ON = {"enable_thinking": True}
OFF = {"enable_thinking": False}
CONTEXT = 4096
SLOW_MS = 20
_LISTEN = re.compile(r"tito mock-engine listening on (http://\S+)")


class Engine:
    def __init__(self, *flags: str):
        cmd = [sys.executable, "-m", "tito.cli", "mock-engine", "--port", "0", *flags]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.cmd = cmd
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, cwd=REPO, env=env)
        self.lines: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            if self.url is None and (m := _LISTEN.search(line)):
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()

    def wait(self, timeout: float = 30.0) -> Engine:
        self._ready.wait(timeout)
        if self.url is None:
            self.stop()
            raise RuntimeError(f"{' '.join(self.cmd)} did not start:\n" + "\n".join(self.lines))
        return self

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Engine]]:
    """Three engines started concurrently: fast qwen3 (+R3), slow qwen3, chatml."""
    qwen, smol = str(TOKENIZERS / "qwen3"), str(TOKENIZERS / "smollm2")
    started = {
        "fast": Engine("--tokenizer", qwen, "--family", "qwen3", "--context-length",
                       str(CONTEXT), "--enable-return-routed-experts", "--num-layers", "3",
                       "--topk", "2", "--num-experts", "8", "--weight-version", "v0"),
        "slow": Engine("--tokenizer", qwen, "--token-latency-ms", str(SLOW_MS)),
        "chatml": Engine("--tokenizer", smol, "--family", "chatml"),
        "incremental": Engine("--tokenizer", qwen, "--token-latency-ms", "2",
                              "--incremental-streaming-output"),
        "fast_stream": Engine("--tokenizer", qwen, "--token-latency-ms", "0.2"),
    }
    try:
        yield {name: e.wait() for name, e in started.items()}
    finally:
        for e in started.values():
            e.stop()


@pytest.fixture(scope="module")
def fast(engines: dict[str, Engine]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=engines["fast"].url, timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def qwen3():
    return build_renderer("qwen3", TOKENIZERS / "qwen3")


@pytest.fixture(scope="module")
def chatml():
    return build_renderer("chatml", TOKENIZERS / "smollm2")


def prompt(renderer, text: str, kwargs: dict[str, Any] | None = None,
           history: list[dict[str, Any]] | None = None) -> list[int]:
    messages = [{"role": "system", "content": "You are a test."}, *(history or []),
                {"role": "user", "content": text}]
    return renderer.render_prompt(messages, template_kwargs=kwargs)


def gen(client: httpx.Client, ids: list[int], **body: Any) -> dict[str, Any]:
    res = client.post("/generate", json={"input_ids": ids, **body})
    assert res.status_code == 200, res.text
    return res.json()


# -- pure parts ----------------------------------------------------------------------------
def test_parse_directives() -> None:
    s = parse_directives("hi\n  SAY one\nCALL f {\"a\": 1}\nCALL g\nCALL h {bad\nLONG x\n"
                         "THINK t\nSAYS no\nSAY two\nLONG 7")
    assert s.say == ["one", "two"]
    assert s.calls == [("f", '{"a": 1}'), ("g", "{}"), ("h", "{bad")]
    assert s.think == ["t"]
    assert s.long == 7
    assert parse_directives("nothing here\nsay lower").empty


def test_radix_cache_exact_per_token() -> None:
    cache = RadixCache()
    a = list(range(100, 150))
    cache.insert(a)
    assert cache.match(a) == 50
    assert cache.match([*a[:37], 1, 2, 3]) == 37
    assert cache.match([*a, 7, 8]) == 50
    assert cache.match([5]) == 0
    cache.insert(a[:20] + [9] * 10)
    assert cache.match(a[:20] + [9] * 5 + [1]) == 25
    cache.clear()
    assert cache.match(a) == 0


# -- directives ----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [ON, OFF])
def test_say_renders_the_family_message(fast, qwen3, kwargs) -> None:
    out = gen(fast, prompt(qwen3, "Hello!\nSAY hello world", kwargs), rid=f"say-{kwargs}")
    expected = qwen3.render_completion({"role": "assistant", "content": "hello world"},
                                       template_kwargs=kwargs)
    assert out["output_ids"] == expected
    assert out["output_ids"][-1] == QWEN_STOP
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": QWEN_STOP}
    assert meta["completion_tokens"] == len(expected)
    assert out["text"].endswith("hello world") and "<|im_end|>" not in out["text"]
    for key in ("id", "prompt_tokens", "cached_tokens", "weight_version", "e2e_latency"):
        assert key in meta
    assert meta["reasoning_tokens"] == 0 and meta["num_retractions"] == 0
    assert meta["weight_version"] == "v0"
    assert "output_token_logprobs" not in meta
    assert qwen3.parse(out["output_ids"], "stop").content == "hello world"


@pytest.mark.parametrize("kwargs", [ON, OFF])
def test_call_single_and_parallel(fast, qwen3, kwargs) -> None:
    one = gen(fast, prompt(qwen3, 'CALL get_weather {"city": "Paris"}', kwargs))
    parsed = qwen3.parse(one["output_ids"], "stop")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in parsed.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert parsed.finish_reason == "tool_calls"
    two = gen(fast, prompt(qwen3, 'Go.\nCALL a {"x": 1}\nignored line\nCALL b {"y": [2]}',
                           kwargs))
    calls = qwen3.parse(two["output_ids"], "stop").tool_calls
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"y": [2]}
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
        {"type": "function", "function": {"name": "b", "arguments": '{"y": [2]}'}}]}
    assert two["output_ids"] == qwen3.render_completion(message, template_kwargs=kwargs)


def test_think_on_and_off(fast, qwen3) -> None:
    on = gen(fast, prompt(qwen3, "THINK let me see\nSAY done", ON))
    assert on["output_ids"] == qwen3.render_completion(
        {"role": "assistant", "content": "done", "reasoning_content": "let me see"},
        template_kwargs=ON)
    parsed = qwen3.parse(on["output_ids"], "stop")
    assert (parsed.reasoning_content, parsed.content) == ("let me see", "done")
    off = gen(fast, prompt(qwen3, "THINK let me see\nSAY done", OFF))
    assert off["output_ids"] == qwen3.render_completion(
        {"role": "assistant", "content": "done"}, template_kwargs=OFF)
    assert "let me see" not in qwen3.tokenizer.decode(off["output_ids"])


def test_long_runs_to_length(fast, qwen3) -> None:
    out = gen(fast, prompt(qwen3, "LONG 20"), return_logprob=True)
    assert len(out["output_ids"]) == 20
    assert not set(out["output_ids"]) & set(qwen3.stop_ids)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 20}
    cut = gen(fast, prompt(qwen3, "LONG 50"), sampling_params={"max_new_tokens": 7})
    assert cut["output_ids"] == out["output_ids"][:7]
    assert cut["meta_info"]["finish_reason"] == {"type": "length", "length": 7}


def test_default_reply_is_deterministic(fast, qwen3) -> None:
    ids = prompt(qwen3, "What is the weather like?")
    a, b = gen(fast, ids, return_logprob=True), gen(fast, ids, return_logprob=True)
    assert a["output_ids"] == b["output_ids"]
    assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]
    assert qwen3.parse(a["output_ids"], "stop").content.startswith("Mock reply ")
    other = gen(fast, prompt(qwen3, "Something else entirely"))
    assert other["output_ids"] != a["output_ids"]


def test_reads_the_last_tool_response(fast, qwen3) -> None:
    history = [
        {"role": "user", "content": "CALL f {}\nCALL g {}"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "content": "SAY from f"},
        {"role": "tool", "content": "result of g\nSAY from g"},
    ]
    ids = qwen3.render_prompt([{"role": "system", "content": "s"}, *history],
                              template_kwargs=OFF)
    out = gen(fast, ids)
    assert qwen3.parse(out["output_ids"], "stop").content == "from g"
    # the user message after the assistant turn wins over older ones
    ids = prompt(qwen3, "SAY fresh", OFF, history=[*history, {"role": "assistant",
                                                              "content": "ok"}])
    assert qwen3.parse(gen(fast, ids)["output_ids"], "stop").content == "fresh"


def test_chatml_family(engines, chatml) -> None:
    ids = chatml.render_prompt([{"role": "user", "content": "SAY hi there"}])
    with httpx.Client(base_url=engines["chatml"].url, timeout=10) as client:
        out = gen(client, ids, return_logprob=True)
        assert out["output_ids"] == chatml.render_completion(
            {"role": "assistant", "content": "hi there"})
        assert out["output_ids"][-1] == chatml.primary_stop_id
        assert out["meta_info"]["finish_reason"] == {"type": "stop",
                                                     "matched": chatml.primary_stop_id}
        # routed experts are silently omitted without the launch flag, as in SGLang
        assert "routed_experts" not in gen(client, ids, return_routed_experts=True)["meta_info"]


# -- sampling ------------------------------------------------------------------------------
def test_logprobs_aligned_negative_deterministic(fast, qwen3) -> None:
    ids = prompt(qwen3, "SAY some words to score")
    out = gen(fast, ids, rid="lp-1", return_logprob=True, return_text_in_logprobs=True)
    meta = out["meta_info"]
    rows = meta["output_token_logprobs"]
    assert len(rows) == meta["output_token_logprobs_length"] == len(out["output_ids"])
    assert [r[1] for r in rows] == out["output_ids"]
    assert all(r[0] < 0 for r in rows)
    assert all(float(np.float32(r[0])) == r[0] for r in rows)  # exact through float32
    assert [r[2] for r in rows] == [qwen3.tokenizer.decode([t]) for t in out["output_ids"]]
    assert meta["input_token_logprobs"] == []
    again = gen(fast, ids, return_logprob=True)["meta_info"]["output_token_logprobs"]
    assert [r[:2] for r in again] == [r[:2] for r in rows]
    assert all(r[2] is None for r in again)
    log = {e["rid"]: e for e in fast.get("/mock/requests").json()}
    assert log["lp-1"]["logprobs"] == [r[0] for r in rows]
    # prompt logprobs from logprob_start_len: the first entry has a null logprob
    pl = gen(fast, ids, return_logprob=True, logprob_start_len=3,
             top_logprobs_num=2)["meta_info"]
    assert [r[1] for r in pl["input_token_logprobs"]] == ids[3:]
    assert pl["input_token_logprobs"][0][0] is None
    assert all(len(top) == 2 for top in pl["output_top_logprobs"])


def test_max_new_tokens_stop_ids_and_ignore_eos(fast, qwen3) -> None:
    ids = prompt(qwen3, "SAY alpha beta gamma delta", OFF)
    full = gen(fast, ids)["output_ids"]
    cut = gen(fast, ids, sampling_params={"max_new_tokens": 3})
    assert cut["output_ids"] == full[:3]
    assert cut["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    stop_at = full[2]
    early = gen(fast, ids, sampling_params={"stop_token_ids": [stop_at]})
    assert early["output_ids"] == full[:3]
    assert early["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}
    endless = gen(fast, ids, sampling_params={"ignore_eos": True, "max_new_tokens": 30})
    assert endless["output_ids"][: len(full)] == full and len(endless["output_ids"]) == 30
    assert endless["meta_info"]["finish_reason"] == {"type": "length", "length": 30}
    text = gen(fast, ids, sampling_params={"stop": [" gamma"]})
    assert text["meta_info"]["finish_reason"] == {"type": "stop", "matched": " gamma"}
    assert text["text"] == "alpha beta"
    kept = gen(fast, ids, sampling_params={"no_stop_trim": True, "skip_special_tokens": False})
    assert kept["text"].endswith("<|im_end|>")
    zero = gen(fast, ids, sampling_params={"max_new_tokens": 0})
    assert zero["output_ids"] == [] and zero["meta_info"]["finish_reason"]["type"] == "length"


def stream_chunks(client: httpx.Client, ids: list[int], *, pause_after: int | None = None,
                  **body: Any) -> list[dict[str, Any]]:
    """The chunks of a streamed /generate (``pause_after``: the reader falls behind for
    0.3 s after that many chunks)."""
    with client.stream("POST", "/generate", json={
            "input_ids": ids, "stream": True, "return_logprob": True, **body}) as res:
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("text/event-stream")
        events = []
        for line in res.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == pause_after:
                    time.sleep(0.3)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_stream_is_cumulative(engines, qwen3) -> None:
    """SGLang's default: every chunk holds all the ids, logprob entries and text so far
    (completion_tokens counts them); the last one is the whole reply."""
    ids = prompt(qwen3, "SAY streamed words here and some more of them", OFF)
    with httpx.Client(base_url=engines["slow"].url, timeout=10) as client:
        whole = gen(client, ids, return_logprob=True)
        chunks = stream_chunks(client, ids)
    out, rows = whole["output_ids"], whole["meta_info"]["output_token_logprobs"]
    assert len(chunks) > 1
    lengths = [len(chunk["output_ids"]) for chunk in chunks]
    assert lengths == sorted(set(lengths))  # growing (one per id when the reader keeps up)
    for n, chunk in zip(lengths[:-1], chunks[:-1], strict=True):
        meta = chunk["meta_info"]
        assert chunk["output_ids"] == out[:n] and meta["finish_reason"] is None
        assert meta["completion_tokens"] == n
        assert meta["output_token_logprobs"] == rows[:n]
        assert chunk["text"] == qwen3.tokenizer.decode(out[:n])
    last = chunks[-1]
    assert last["output_ids"] == out and last["text"] == whole["text"]
    assert last["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert last["meta_info"]["output_token_logprobs"] == rows


def test_a_cumulative_reader_that_is_behind_gets_the_newest_chunk_only(engines, qwen3) -> None:
    """Chunks queued while the writer waited for a reader that is behind are dropped but
    the newest (the mock logs how many chunks a stream sent)."""
    ids = prompt(qwen3, "LONG 3000", OFF)
    with httpx.Client(base_url=engines["fast_stream"].url, timeout=30) as client:
        whole = gen(client, ids, return_logprob=True)["output_ids"]
        client.delete("/mock/requests")
        chunks = stream_chunks(client, ids, pause_after=1)
        (entry,) = client.get("/mock/requests").json()
    assert entry["stream_chunks"] == len(chunks) and 1 < len(chunks) < len(whole)
    for a, b in itertools.pairwise(chunks):
        assert len(a["output_ids"]) < len(b["output_ids"]) and \
            b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
    assert chunks[-1]["output_ids"] == whole


def test_incremental_stream_chunks_join_to_the_whole_reply(engines, qwen3) -> None:
    """--incremental-streaming-output: each chunk holds the ids, logprob entries and text
    since the previous one (a reader that is behind gets the queued ones joined, none
    lost); completion_tokens counts all so far; the final chunk's other fields are
    whole."""
    ids = prompt(qwen3, "LONG 200", OFF)
    with httpx.Client(base_url=engines["incremental"].url, timeout=10) as client:
        whole = gen(client, ids, return_logprob=True)
        chunks = stream_chunks(client, ids, pause_after=3)
    assert len(chunks) > 1
    joined: list[int] = []
    rows: list[Any] = []
    for chunk in chunks:
        joined += chunk["output_ids"]
        rows += chunk["meta_info"]["output_token_logprobs"]
        assert chunk["meta_info"]["completion_tokens"] == len(joined)
        assert chunk["text"] == qwen3.tokenizer.decode(chunk["output_ids"])
    assert joined == whole["output_ids"]
    assert rows == whole["meta_info"]["output_token_logprobs"]
    final = chunks[-1]["meta_info"]
    assert final["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert final["prompt_tokens"] == whole["meta_info"]["prompt_tokens"]
    info = client_info(engines["incremental"].url)
    assert info["incremental_streaming_output"] is True


def client_info(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/server_info").json())


# -- validation ----------------------------------------------------------------------------
def test_validation_errors(fast, qwen3) -> None:
    ids = prompt(qwen3, "SAY x")
    res = fast.post("/generate", json={"input_ids": ids, "sampling_params": {"max_tokens": 5}})
    assert res.status_code == 400
    error = res.json()["error"]
    assert isinstance(error, str)
    assert error.startswith("unknown field `max_tokens`, expected one of `max_new_tokens`")
    res = fast.post("/generate", json={"input_ids": []})
    assert (res.status_code, res.json()) == (400, {"error": {
        "message": "input_ids cannot be empty."}})
    long_ids = [100] * CONTEXT
    res = fast.post("/generate", json={"input_ids": long_ids})
    assert (res.status_code, res.json()["error"]["message"]) == (400, (
        f"The input ({CONTEXT} tokens) is longer than the model's context length "
        f"({CONTEXT} tokens)."))
    res = fast.post("/generate", json={"input_ids": [100] * 4000,
                                       "sampling_params": {"max_new_tokens": 200}})
    assert res.status_code == 400
    assert res.json()["error"]["message"].startswith(
        f"Requested token count exceeds the model's maximum context length of {CONTEXT} tokens.")
    res = fast.post("/generate", json={"input_ids": ids, "sampling_params": {"top_p": 0}})
    assert res.status_code == 400 and "top_p" in res.json()["error"]["message"]
    res = fast.post("/generate", json={"input_ids": ids,
                                       "sampling_params": {"max_new_tokens": "5"}})
    assert res.status_code == 400 and isinstance(res.json()["error"], str)
    # unknown top-level keys are ignored
    assert gen(fast, ids, some_future_field=1)["meta_info"]["finish_reason"]["type"] == "stop"


# -- cache, R3, log, control plane ---------------------------------------------------------
def test_cached_tokens_follow_the_radix_cache(fast, qwen3) -> None:
    assert fast.post("/flush_cache").status_code == 200
    first = prompt(qwen3, "SAY first turn", OFF)
    a = gen(fast, first)
    assert a["meta_info"]["cached_tokens"] == 0
    assert gen(fast, first)["meta_info"]["cached_tokens"] == len(first) - 1
    bridge = qwen3.tokenizer.encode("\n<|im_start|>user\nSAY second<|im_end|>\n"
                                    "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    second = first + a["output_ids"] + bridge
    b = gen(fast, second)
    assert b["meta_info"]["cached_tokens"] == len(first) + len(a["output_ids"]) - 1
    assert b["meta_info"]["prompt_tokens"] == len(second)
    assert fast.post("/flush_cache").status_code == 200
    assert gen(fast, second)["meta_info"]["cached_tokens"] == 0


def test_routed_experts(fast, qwen3) -> None:
    ids = prompt(qwen3, "SAY routed")
    out = gen(fast, ids, return_routed_experts=True)
    n = len(ids) + len(out["output_ids"]) - 1
    experts = np.frombuffer(base64.b64decode(out["meta_info"]["routed_experts"]), "<i4")
    experts = experts.reshape(-1, 3, 2)
    assert experts.shape == (n, 3, 2)
    assert experts.min() >= 0 and experts.max() < 8
    assert all(len(set(row)) == 2 for row in experts.reshape(-1, 2).tolist())
    part = gen(fast, ids, return_routed_experts=True, routed_experts_start_len=5)
    tail = np.frombuffer(base64.b64decode(part["meta_info"]["routed_experts"]), "<i4")
    assert np.array_equal(tail.reshape(-1, 3, 2), experts[5:])
    assert "routed_experts" not in gen(fast, ids)["meta_info"]


def test_request_log(fast, qwen3) -> None:
    assert fast.delete("/mock/requests").status_code == 200
    ids = prompt(qwen3, "SAY logged")
    gen(fast, ids, rid="log-1", sampling_params={"max_new_tokens": 4, "temperature": 0.5})
    out = gen(fast, ids, rid="log-2")
    log = fast.get("/mock/requests").json()
    assert [e["rid"] for e in log] == ["log-1", "log-2"]
    assert log[0]["input_ids"] == ids
    assert log[0]["sampling_params"] == {"max_new_tokens": 4, "temperature": 0.5}
    assert log[0]["finish_reason"] == {"type": "length", "length": 4}
    assert log[1]["output_ids"] == out["output_ids"]
    assert len(log[1]["logprobs"]) == len(out["output_ids"])
    fast.delete("/mock/requests")
    assert fast.get("/mock/requests").json() == []


def test_info_routes_and_weight_version(fast, qwen3) -> None:
    assert fast.get("/health").status_code == 200
    assert fast.get("/health_generate").status_code == 200
    for path in ("/model_info", "/get_model_info"):
        info = fast.get(path).json()
        assert info["is_generation"] is True and info["weight_version"] == "v0"
    models = fast.get("/v1/models").json()
    assert models["data"][0]["max_model_len"] == CONTEXT
    res = fast.post("/update_weight_version", json={"new_version": "v1"})
    assert res.status_code == 200 and res.json()["success"] is True
    try:
        out = gen(fast, prompt(qwen3, "SAY v"))
        assert out["meta_info"]["weight_version"] == "v1"
        assert fast.get("/model_info").json()["weight_version"] == "v1"
    finally:
        fast.post("/update_weight_version", json={"new_version": "v0"})
    assert fast.post("/abort_request", json={"rid": "nobody"}).status_code == 200


# -- concurrency: abort, duplicate rid, pause ----------------------------------------------
async def test_abort_mid_generation_and_duplicate_rid(engines, qwen3) -> None:
    ids = prompt(qwen3, "LONG 500")
    async with httpx.AsyncClient(base_url=engines["slow"].url, timeout=30) as client:
        t0 = time.monotonic()
        parent = asyncio.create_task(client.post("/generate", json={
            "input_ids": ids, "rid": "grp", "return_logprob": True}))
        child = asyncio.create_task(client.post("/generate", json={
            "input_ids": ids, "rid": "grp-child"}))
        other = asyncio.create_task(client.post("/generate", json={
            "input_ids": prompt(qwen3, "SAY unaffected"), "rid": "other"}))
        await asyncio.sleep(0.25)
        dup = await client.post("/generate", json={"input_ids": ids, "rid": "grp"})
        assert (dup.status_code, dup.json()) == (400, {"error": {
            "message": "Duplicate request ID detected: grp"}})
        # a prefix that is not itself in flight is dropped, as SGLang's tokenizer manager does
        assert (await client.post("/abort_request", json={"rid": "gr"})).status_code == 200
        await asyncio.sleep(0.05)
        assert not parent.done()
        assert (await client.post("/abort_request", json={"rid": "grp"})).status_code == 200
        res, res_child, res_other = await parent, await child, await other
        assert time.monotonic() - t0 < 5
    assert res.status_code == 200 and res_child.status_code == 200
    out = res.json()
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "abort", "message": "Aborted",
                                     "status_code": None, "err_type": None}
    assert 0 < len(out["output_ids"]) < 500
    assert meta["completion_tokens"] == len(out["output_ids"])
    assert len(meta["output_token_logprobs"]) == len(out["output_ids"])
    assert res_child.json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert res_other.json()["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.slow  # real pauses
async def test_pause_modes(engines, qwen3) -> None:
    async with httpx.AsyncClient(base_url=engines["slow"].url, timeout=30) as client:
        try:
            # in_place: requests wait while paused, then finish normally
            assert (await client.post("/pause_generation",
                                      json={"mode": "in_place"})).json()["status"] == "ok"
            task = asyncio.create_task(client.post("/generate", json={
                "input_ids": prompt(qwen3, "SAY waiting"), "rid": "p1"}))
            await asyncio.sleep(0.3)
            assert not task.done()
            await client.post("/continue_generation", json={})
            assert (await task).json()["meta_info"]["finish_reason"]["type"] == "stop"
            # retract: a running request is frozen, counted, and resumed
            task = asyncio.create_task(client.post("/generate", json={
                "input_ids": prompt(qwen3, "LONG 15"), "rid": "p2"}))
            await asyncio.sleep(0.1)
            await client.post("/pause_generation", json={"mode": "retract"})
            await asyncio.sleep(0.1)
            await client.post("/continue_generation", json={})
            meta = (await task).json()["meta_info"]
            assert meta["finish_reason"] == {"type": "length", "length": 15}
            assert meta["num_retractions"] == 1
            # abort: running requests end with their partial output; new ones wait, and an
            # abort while waiting gives SGLang's reduced waiting-queue answer
            task = asyncio.create_task(client.post("/generate", json={
                "input_ids": prompt(qwen3, "LONG 400"), "rid": "p3"}))
            await asyncio.sleep(0.15)
            await client.post("/pause_generation", json={"mode": "abort"})
            aborted = (await task).json()
            assert aborted["meta_info"]["finish_reason"]["type"] == "abort"
            assert 0 < len(aborted["output_ids"]) < 400
            waiting = asyncio.create_task(client.post("/generate", json={
                "input_ids": prompt(qwen3, "SAY never"), "rid": "p4"}))
            await asyncio.sleep(0.1)
            await client.post("/abort_request", json={"rid": "p4"})
            out = (await waiting).json()
            assert out["output_ids"] == []
            assert out["meta_info"]["finish_reason"]["message"] == "Abort in waiting queue"
            assert "prompt_tokens" not in out["meta_info"]
        finally:
            await client.post("/continue_generation", json={})


@pytest.mark.slow  # waits for a real disconnect
def test_client_disconnect_aborts(engines, qwen3) -> None:
    ids = prompt(qwen3, "LONG 300")
    with httpx.Client(base_url=engines["slow"].url, timeout=10) as client:
        client.delete("/mock/requests")
        with client.stream("POST", "/generate", json={
                "input_ids": ids, "rid": "gone-stream", "stream": True}) as res:
            seen = 0
            for line in res.iter_lines():
                seen += line.startswith("data: ")
                if seen == 3:
                    break
        with pytest.raises(httpx.TimeoutException):
            client.post("/generate", json={"input_ids": ids, "rid": "gone"}, timeout=0.2)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            log = {e["rid"]: e for e in client.get("/mock/requests").json()}
            if all(log[r]["finish_reason"] for r in ("gone-stream", "gone")):
                break
            time.sleep(0.05)
        for rid in ("gone-stream", "gone"):
            assert log[rid]["finish_reason"]["type"] == "abort"
            assert 0 < len(log[rid]["output_ids"]) < 300
        # the rid is free again
        out = gen(client, ids, rid="gone", sampling_params={"max_new_tokens": 2})
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
