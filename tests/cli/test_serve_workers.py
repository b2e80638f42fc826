"""``tito serve --workers N``: N gateway processes on consecutive ports, sessions that
name their worker, clients that place sessions on them (real processes, the mock engine)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from helpers.support import Proc, start_mock, start_tito, tokenizer_dir

from tito.client.agent import generate
from tito.client.tracer import SessionTracer, TracedSession
from tito.launch import tito_command
from tito.net import free_port_block
from tito.types.placement import worker_of

pytestmark = pytest.mark.slow  # starts four processes
KEY = "sekrit-key"


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


def test_workers_stop_when_their_supervisor_is_killed() -> None:
    tokenizer = tokenizer_dir("qwen3")
    engine = start_mock(tokenizer, "qwen3")
    base = free_port_block(2)
    try:
        parent = start_tito("serve", "--engine-url", engine.url, "--tokenizer",
                            str(tokenizer), "--family", "qwen3", "--port", str(base),
                            "--workers", "2", timeout=180)
        parent.process.kill()  # the supervisor: no chance to stop its workers itself
        parent.process.wait()
        for port in (base, base + 1):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                except httpx.HTTPError:
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(f"the worker on {port} outlived its supervisor")
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


async def keyed_say(base_url: str, prompt: list[dict[str, Any]],
                    request_kwargs: dict[str, Any], metadata: dict[str, Any],
                    **_: Any) -> None:
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=KEY,
                                  max_retries=0) as client:
        await client.chat.completions.create(model="m", messages=prompt, **request_kwargs)


def wait_for(check: Any, what: str, seconds: float = 60.0) -> Any:
    """Poll ``check()`` until it returns something true (an AssertionError after
    ``seconds``: a wait, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if got := check():
                return got
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"waited {seconds:g}s for {what}")


def health(url: str) -> dict[str, Any]:
    resp = httpx.get(url + "/health", timeout=5)
    assert resp.status_code == 200, resp.text  # degraded by a peer: still 200
    return dict(resp.json())


def worker_processes(supervisor: Proc) -> dict[int, tuple[int, str]]:
    """The supervisor's workers by index: (pid, command line as ``ps`` shows it)."""
    out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(supervisor.pid)],
                         capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        pid, args = line.strip().split(" ", 1)
        argv = args.split()
        assert "--worker-index" in argv, out
        found[int(argv[argv.index("--worker-index") + 1])] = (int(pid), args)
    return found


def refused(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=1)
    except httpx.ConnectError:
        return True
    return False


async def test_a_killed_worker_is_restarted_and_clients_go_around_it(tmp_path: Any) -> None:
    """kill -9 of worker 1 while its supervisor is held (SIGSTOP, so the outage lasts):
    worker 0 says degraded and answers 503 worker_unavailable for worker 1's sessions; the
    tracer places every new session on worker 0 with no error and waits for the dead
    worker's collection; once the supervisor runs again it restarts worker 1, whose
    session comes back from its journal. No worker's command line holds the API key."""
    tokenizer = tokenizer_dir("qwen3")
    engine = start_mock(tokenizer, "qwen3")
    base = free_port_block(2)
    urls = [f"http://127.0.0.1:{base + i}" for i in range(2)]
    auth = {"authorization": f"Bearer {KEY}"}
    env = {k: v for k, v in os.environ.items() if k != "TITO_API_KEY"}
    parent: Proc | None = None
    try:
        parent = start_tito("serve", "--engine-url", engine.url, "--tokenizer",
                            str(tokenizer), "--family", "qwen3", "--port", str(base),
                            "--workers", "2", "--journal", str(tmp_path / "j"),
                            "--api-key", KEY, timeout=180, env=env)
        procs = worker_processes(parent)
        assert sorted(procs) == [0, 1]
        for _, args in procs.values():  # what ps shows
            assert KEY not in args and "--api-key" not in args
        assert httpx.post(urls[1] + "/sessions").status_code == 401  # the key still holds
        sid = httpx.post(urls[1] + "/sessions", headers=auth).json()["session_id"]
        reply = openai.OpenAI(base_url=f"{urls[1]}/sessions/{sid}/v1", api_key=KEY,
                              max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "SAY Kept."}])
        assert reply.choices[0].message.content == "Kept."
        wrong = httpx.get(f"{urls[0]}/sessions/{sid}", headers=auth)
        assert wrong.status_code == 421 and wrong.json()["error"]["code"] == "wrong_worker"

        os.kill(parent.pid, signal.SIGSTOP)  # the supervisor cannot restart it yet
        try:
            os.kill(procs[1][0], signal.SIGKILL)
            wait_for(lambda: refused(urls[1]), "worker 1 to go")
            state = health(urls[0])
            assert state["status"] == "degraded" and state["engine"]["ok"] is True
            assert [d["index"] for d in state["workers"]["down"]] == [1]
            gone = httpx.get(f"{urls[0]}/sessions/{sid}", headers=auth)
            assert gone.status_code == 503 and gone.headers["retry-after"] == "1"
            assert gone.json()["error"]["code"] == "worker_unavailable"
            assert str(base + 1) in gone.json()["error"]["message"]

            async with SessionTracer(urls, api_key=KEY) as tracer:
                for key in range(8):  # every key, also those hashed to worker 1
                    samples = await generate(keyed_say,
                                             [{"role": "user", "content": "SAY Around."}],
                                             {"max_new_tokens": 16}, tracer=tracer,
                                             index=key)
                    assert samples[0].status == "completed", samples[0].metadata
                kept = TracedSession(sid, f"{urls[1]}/sessions/{sid}")
                collecting = asyncio.create_task(tracer.collect(kept))
                await asyncio.sleep(1.0)  # it is waiting for worker 1
                assert not collecting.done()
                os.kill(parent.pid, signal.SIGCONT)
                decoded = await collecting  # worker 1 is back, its session from the journal
            assert decoded.samples[0].response.endswith("Kept.<|im_end|>")
        finally:
            os.kill(parent.pid, signal.SIGCONT)
        assert health(urls[1])["sessions"] == 0  # collected, then deleted
        wait_for(lambda: health(urls[0])["status"] == "ok", "worker 0 to see worker 1 back")
        pid, args = worker_processes(parent)[1]
        assert pid != procs[1][0] and KEY not in args
        log = "\n".join(parent.lines)
        assert "worker 1" in log and "restarting it, resuming from" in log
        assert "is back on" in log
    finally:
        if parent is not None:
            parent.stop()
        engine.stop()
