"""The load generator: a workload's sessions played from a child process (own event loop,
aiohttp), against a gateway (chat requests) or an engine (token requests), with the CPU
of the watched server processes measured over exactly the timed part."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from _processes import busy_cpu_s, cpu_ns, peak_rss_bytes
from _workload import Workload

SAMPLING = {
    "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
    "presence_penalty": 0.0, "repetition_penalty": 1.0, "no_stop_trim": True,
    "skip_special_tokens": False,
}


@dataclass
class LoadResult:
    mode: str
    wall_s: float
    latencies_ms: list[float]
    errors: list[str]
    loadgen_cpu_s: float
    output_tokens: int
    prompt_tokens_last: int
    prompt_growth: float
    session_ids: list[str] = field(default_factory=list)


_JSON_HEADERS = {"content-type": "application/json"}


@dataclass
class _Tally:
    """What the sessions of one load run measured (one event loop: no locking needed)."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    out_tokens: int = 0
    last_prompt: int = 0
    growth: list[int] = field(default_factory=list)

    def record_turn(self, prompt_tokens: int, prev: int, output_tokens: int) -> int:
        """Count one answered turn; returns its prompt length (the next turn's ``prev``)."""
        self.out_tokens += output_tokens
        if prev:
            self.growth.append(prompt_tokens - prev)
        self.last_prompt = max(self.last_prompt, prompt_tokens)
        return prompt_tokens


@dataclass
class _Payloads:
    """The request pieces every turn reuses, serialized once."""

    appended_json: bytes
    tail: bytes
    sampling: dict[str, Any]
    bridge_json: bytes

    @classmethod
    def of(cls, wl: Workload) -> _Payloads:
        import orjson

        return cls(appended_json=orjson.dumps(wl.appended),
                   tail=orjson.dumps({"max_tokens": wl.max_tokens, "temperature": 1.0})[1:],
                   sampling={**SAMPLING, "max_new_tokens": wl.max_tokens},
                   bridge_json=orjson.dumps(wl.bridge_ids)[1:-1])


class _LoadRun:
    """One load generator run: the sessions of ``wl`` against ``url`` over ``http``."""

    def __init__(self, mode: str, url: str, wl: Workload, http: Any) -> None:
        self.mode = mode
        self.url = url
        self.urls = url.split(",")
        """Several gateway workers (``url`` = ``URL0,URL1,...``): session i goes to
        ``urls[i % len(urls)]``, as a client that places its sessions would."""
        self.wl = wl
        self.http = http
        self.sids: list[str] = []
        self.tally = _Tally()

    async def open_sessions(self) -> None:
        """Create the gateway sessions (the token baselines have none)."""
        if self.mode != "gateway":
            return
        for i in range(self.wl.sessions):
            async with self.http.post(self.url_of(i) + "/sessions") as resp:
                self.sids.append((await resp.json())["session_id"])

    def url_of(self, i: int) -> str:
        return self.urls[i % len(self.urls)]

    async def warm_pool(self) -> None:
        """Warm the connection pool so the timed run does not pay for TCP handshakes."""
        async def ping(i: int) -> None:
            async with self.http.get(self.url_of(i) + "/health") as resp:
                await resp.read()
        await asyncio.gather(*(ping(i) for i in range(min(self.wl.sessions, 256))))

    async def timed_post(self, endpoint: str, body: bytes) -> bytes | None:
        """POST ``body``, record its latency; the response body, or None (error recorded)."""
        t0 = time.perf_counter()
        async with self.http.post(endpoint, data=body, headers=_JSON_HEADERS) as resp:
            raw = await resp.read()
            status = resp.status
        self.tally.latencies.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            self.tally.errors.append(f"{status}: {raw[:300]!r}")
            return None
        return raw

    async def chat_session(self, i: int, pay: _Payloads) -> None:
        """Session ``i`` through the gateway: the full chat history every turn."""
        import orjson

        wl, tally = self.wl, self.tally
        endpoint = f"{self.url_of(i)}/sessions/{self.sids[i]}/v1/chat/completions"
        history = bytearray(b",".join(orjson.dumps(m) for m in wl.first_messages[i]))
        prev = 0
        for t in range(wl.turns):
            raw = await self.timed_post(endpoint, b'{"messages":[' + history + b"]," + pay.tail)
            if raw is None:
                return
            data = orjson.loads(raw)
            choice = data["choices"][0]
            usage = data["usage"]
            prev = tally.record_turn(usage["prompt_tokens"], prev, usage["completion_tokens"])
            if choice["finish_reason"] != "stop":
                tally.errors.append(f"turn {t}: finish_reason {choice['finish_reason']}")
            history += b"," + orjson.dumps(choice["message"]) + b"," + pay.appended_json

    async def token_session(self, i: int, pay: _Payloads) -> None:
        """Session ``i`` as token requests to ``/generate`` (the gateway's ids, precomputed)."""
        import orjson

        wl, tally = self.wl, self.tally
        endpoint = f"{self.url}/generate"
        ids = bytearray(orjson.dumps(wl.first_prompt_ids[i])[1:-1])
        n_ids = len(wl.first_prompt_ids[i])
        prev = 0
        for t in range(wl.turns):
            request: dict[str, Any] = {"rid": f"bench-{self.mode}-{i}-{t}",
                                       "sampling_params": pay.sampling, "return_logprob": True,
                                       "logprob_start_len": -1, "stream": False}
            if wl.routing is not None:  # the rows the gateway would ask for
                start = n_ids - len(wl.bridge_ids) - 1 if t and wl.routing == "incremental" \
                    else 0
                request.update(return_routed_experts=True, routed_experts_start_len=start)
            head = orjson.dumps(request)
            raw = await self.timed_post(endpoint, b'{"input_ids":[' + ids + b"]," + head[1:])
            if raw is None:
                return
            data = orjson.loads(raw)
            output = data["output_ids"]
            prev = tally.record_turn(n_ids, prev, len(output))
            if data["meta_info"]["finish_reason"]["type"] != "stop":
                tally.errors.append(f"turn {t}: finish {data['meta_info']['finish_reason']}")
            ids += b"," + orjson.dumps(output)[1:-1] + b"," + pay.bridge_json
            n_ids += len(output) + len(wl.bridge_ids)

    async def run_sessions(self) -> tuple[float, float]:
        """Play every session (bounded, staggered); the wall and own CPU seconds it took."""
        wl = self.wl
        pay = _Payloads.of(wl)
        run = self.chat_session if self.mode == "gateway" else self.token_session
        limit = asyncio.Semaphore(wl.concurrency or wl.sessions)

        async def bounded(i: int) -> None:
            if wl.stagger_s > 0:
                await asyncio.sleep(wl.stagger_s * i / wl.sessions)
            async with limit:
                await run(i, pay)

        cpu0 = time.process_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(bounded(i) for i in range(wl.sessions)))
        wall = time.perf_counter() - t0
        return wall, time.process_time() - cpu0

    async def close_sessions(self) -> None:
        """Delete the gateway sessions unless the workload keeps them."""
        if self.mode != "gateway" or self.wl.keep_sessions:
            return

        async def delete(i: int, sid: str) -> None:
            async with self.http.delete(f"{self.url_of(i)}/sessions/{sid}") as resp:
                await resp.read()
        await asyncio.gather(*(delete(i, s) for i, s in enumerate(self.sids)))

    def result(self, wall: float, cpu: float) -> LoadResult:
        t = self.tally
        return LoadResult(self.mode, wall, t.latencies, t.errors, cpu, t.out_tokens,
                          t.last_prompt, statistics.fmean(t.growth) if t.growth else float("nan"),
                          self.sids)


async def _run_load(mode: str, url: str, wl: Workload, conn: Any) -> LoadResult:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=600)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        load = _LoadRun(mode, url, wl, http)
        await load.open_sessions()
        await load.warm_pool()
        conn.send("ready")
        conn.recv()  # "go"
        wall, cpu = await load.run_sessions()
        await load.close_sessions()
    return load.result(wall, cpu)


def _loadgen_main(mode: str, url: str, wl: Workload, conn: Any) -> None:
    result = asyncio.run(_run_load(mode, url, wl, conn))
    conn.send(result)
    conn.close()


@dataclass
class PhaseResult:
    load: LoadResult
    server_cpu_s: dict[str, float]
    peak_rss: dict[str, int]
    other_cores: float
    """Average cores used by processes outside the benchmark during the timed run."""


def run_phase(mode: str, url: str, wl: Workload, watch: dict[str, int]) -> PhaseResult:
    """Run the load generator in a child process against ``url``.

    ``watch`` maps a name to a pid whose CPU time is measured over exactly the timed part
    (the child says ``ready`` after its setup and waits for ``go``).
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_loadgen_main, args=(mode, url, wl, child), daemon=True)
    proc.start()
    deadline = time.monotonic() + 300
    while not parent.poll(0.2):
        if not proc.is_alive() or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"load generator ({mode}) did not get ready")
    assert parent.recv() == "ready"
    before = {name: cpu_ns(pid) for name, pid in watch.items()}
    busy0 = busy_cpu_s()
    parent.send("go")
    load: LoadResult = parent.recv()
    busy = busy_cpu_s() - busy0
    after = {name: cpu_ns(pid) for name, pid in watch.items()}
    proc.join(30)
    cpu = {name: (after[name] - before[name]) / 1e9 for name in watch}
    other = max(0.0, busy - sum(cpu.values()) - load.loadgen_cpu_s) / max(load.wall_s, 1e-9)
    return PhaseResult(load, cpu, {name: peak_rss_bytes(pid) for name, pid in watch.items()},
                       other)

