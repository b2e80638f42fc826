"""``tito serve --workers N``: N gateway processes on consecutive ports, sessions that
name their worker, clients that place sessions on them (real processes, the mock engine)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from helpers.support import Proc, start_mock, start_tito, tokenizer_dir

from tito.client.agent import generate
from tito.client.tracer import SessionTracer
from tito.launch import tito_command
from tito.net import free_port_block
from tito.types.placement import worker_of

pytestmark = pytest.mark.slow  # starts four processes




@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[Proc, list[str]]]:
    tokenizer = tokenizer_dir("qwen3")
    engine = start_mock(tokenizer, "qwen3")
    base = free_port_block(3)
    try:
        parent = start_tito("serve", "--engine-url", engine.url, "--tokenizer", str(tokenizer),
                            "--family", "qwen3", "--port", str(base), "--workers", "3",
                            timeout=180)
    except Exception:
        engine.stop()
        raise
    try:
        yield parent, [f"http://127.0.0.1:{base + i}" for i in range(3)]
    finally:
        parent.stop()
        engine.stop()


async def say(base_url: str, prompt: list[dict[str, Any]], request_kwargs: dict[str, Any],
              metadata: dict[str, Any], **_: Any) -> None:
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x",
                                  max_retries=0) as client:
        await client.chat.completions.create(model="m", messages=prompt, **request_kwargs)


async def test_workers_hold_their_own_sessions(workers: tuple[Proc, list[str]]) -> None:
    parent, urls = workers
    assert "workers: " + ", ".join(urls) in "\n".join(parent.lines)
    instances = {httpx.get(url + "/health").json()["instance_id"] for url in urls}
    assert len(instances) == 3

    async with SessionTracer(urls) as tracer:
        sessions = [await tracer.create(key=k) for k in range(30)]
        for session in sessions:  # a session id names its worker; the tracer finds it
            worker = worker_of(session.session_id)
            assert worker is not None
            assert session.base_url.startswith(urls[worker] + "/sessions/")
            assert tracer.url_of(session.session_id) == session.base_url
        assert {worker_of(s.session_id) for s in sessions} == {0, 1, 2}
        again = await tracer.create(key=5)  # the same key, the same worker
        assert worker_of(again.session_id) == worker_of(sessions[5].session_id)

        wrong = urls[(worker_of(sessions[0].session_id) + 1) % 3]  # type: ignore[operator]
        resp = httpx.get(f"{wrong}/sessions/{sessions[0].session_id}")
        assert resp.status_code == 421 and resp.json()["error"]["code"] == "wrong_worker"
        assert str(urls[worker_of(sessions[0].session_id)].rsplit(":", 1)[1]) in \
            resp.json()["error"]["message"]  # type: ignore[index]

        samples = await generate(say, [{"role": "user", "content": "SAY Hi."}],
                                 {"max_new_tokens": 16}, tracer=tracer, index=7)
        assert samples[0].status == "completed" and samples[0].response.endswith("Hi.<|im_end|>")
        for session in [*sessions, again]:
            await tracer.delete(session)


def test_rollout_over_the_workers(workers: tuple[Proc, list[str]], tmp_path: Any) -> None:
    _, urls = workers
    out = tmp_path / "out"
    args = [flag for url in urls for flag in ("--gateway", url)]
    proc = subprocess.run(
        [*tito_command("rollout"), *args, "--agent", "tito.examples.scripted_agent:run_agent",
         "--limit", "4", "--n-per-prompt", "3", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["gateway"] == urls and summary["trajectories"] == 12
    used = {url: 0 for url in urls}  # the sessions were spread over the workers
    for url in urls:
        metrics = httpx.get(url + "/metrics").text
        line = next((m for m in metrics.splitlines()  # absent: none created there
                     if m.startswith("tito_sessions_created_total")), "_ 0")
        used[url] = int(float(line.split()[-1]))
    assert sum(used.values()) >= 12 and sum(1 for n in used.values() if n) >= 2, used
    refused = subprocess.run([*tito_command("rollout"), *args, "--engine-url", "http://x",
                              "--out", str(tmp_path / "no")],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--gateway uses running gateways" in refused.stderr


def test_stopping_the_first_worker_stops_them_all(workers: tuple[Proc, list[str]]) -> None:
    parent, urls = workers
    parent.stop()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        alive = []
        for url in urls:
            try:
                httpx.get(url + "/health", timeout=1)
                alive.append(url)
            except httpx.HTTPError:
                pass
        if not alive:
            break
        time.sleep(0.2)
    assert not alive, alive


def test_workers_need_a_port_and_an_engine_server() -> None:
    for flags, message in ((["--engine-url", "http://127.0.0.1:9", "--tokenizer", "x",
                             "--workers", "2", "--port", "0"], "give a --port"),
                           (["--workers", "2", "--port", "8123"], "embedded engine")):
        proc = subprocess.run(tito_command("serve", *flags), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_workers_stop_when_the_first_is_killed() -> None:
    tokenizer = tokenizer_dir("qwen3")
    engine = start_mock(tokenizer, "qwen3")
    base = free_port_block(2)
    try:
        parent = start_tito("serve", "--engine-url", engine.url, "--tokenizer",
                            str(tokenizer), "--family", "qwen3", "--port", str(base),
                            "--workers", "2", timeout=180)
        parent.process.kill()  # no chance to stop its workers itself
        parent.process.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{base + 1}/health", timeout=1)
            except httpx.HTTPError:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("worker 1 outlived the first worker")
    finally:
        engine.stop()


def test_a_restart_with_the_journal_resumes_every_workers_sessions(tmp_path: Any) -> None:
    tokenizer = tokenizer_dir("qwen3")
    engine = start_mock(tokenizer, "qwen3")
    base = free_port_block(2)
    flags = ["serve", "--engine-url", engine.url, "--tokenizer", str(tokenizer), "--family",
             "qwen3", "--port", str(base), "--workers", "2", "--journal", str(tmp_path / "j")]
    try:
        parent = start_tito(*flags, timeout=180)
        worker1 = f"http://127.0.0.1:{base + 1}"
        sid = httpx.post(worker1 + "/sessions").json()["session_id"]
        reply = client_for(worker1, sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "SAY Kept."}])
        assert reply.choices[0].message.content == "Kept."
        parent.stop()
        assert (tmp_path / "j" / "worker-1").is_dir()
        parent = start_tito(*flags, timeout=180)
        try:
            meta = httpx.get(f"{worker1}/sessions/{sid}").json()["metadata"]
            assert meta["num_turns"] == 1
        finally:
            parent.stop()
    finally:
        engine.stop()


def client_for(url: str, sid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x", max_retries=0)
