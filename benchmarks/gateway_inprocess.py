"""Gateway CPU per turn in one process, without sockets: tito's own work, against a floor.

``gateway_overhead.py`` measures the real processes over real sockets on a machine that
three busy processes share; its per-run figures vary by tens of percent. This benchmark
calls the ASGI app directly (no HTTP parsing, no network) and swaps the engine's network
exchange for a canned SGLang reply, so what it times is the gateway's request handling:
validation, planning and tokenization, the engine payload and the reply checks, parsing,
commit and the response. The real SGLang client code runs (payload, ``orjson``, reply
parsing); only its ``_request`` is replaced.

- **floor**: a Starlette app with one route doing the JSON work a gateway cannot avoid on
  the same sizes (the chat body parsed; an id list of the prompt's length serialized; the
  engine reply parsed; a reply serialized), and nothing else;
- **tito**: the real app (``tito.server.app.create_app``) over the real gateway, Qwen3
  tokenizer, family qwen3.

The workload is ``gateway_overhead.py``'s: S sessions at once, T turns each, every turn
appending one message of I tokens and generating O tokens. The two apps alternate run by
run, in a process with the collector settings of ``tito serve`` (:mod:`tito.heap`); CPU is
``time.process_time`` over each run. ``--profile N`` prints the N heaviest tito
functions of one more gateway run (cProfile, cumulative).

    python benchmarks/gateway_inprocess.py                 # S=32 T=20 I=O=64, 5 runs each
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from _paths import QWEN3_DIR
from _tables import fmt, median, print_table
from _workload import add_workload_args, build_workload, say_text

App = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
               Awaitable[None]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_workload_args(p)
    p.add_argument("--repeat", type=int, default=5, help="runs of each app, alternated")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="print the N heaviest tito functions of one more gateway run")
    p.add_argument("--tokenizer", type=Path, default=QWEN3_DIR)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def canned_reply(renderer: Any, output_tokens: int) -> bytes:
    """An SGLang ``/generate`` reply of ``output_tokens`` ids: the workload's SAY reply."""
    ids = list(renderer.render_completion(
        {"role": "assistant", "content": say_text(renderer, output_tokens)}))
    return orjson.dumps({"text": "", "output_ids": ids, "meta_info": {
        "id": "bench", "finish_reason": {"type": "stop", "matched": ids[-1]},
        "prompt_tokens": 0, "completion_tokens": len(ids), "cached_tokens": 0,
        "e2e_latency": 0.001, "weight_version": "default",
        "output_token_logprobs": [[-0.5, i, None] for i in ids]}})


def gateway_app(tokenizer: Path, reply: bytes) -> App:
    """The real app over the real gateway; the SGLang client answers ``reply`` in process."""
    from tito.config import ServerConfig
    from tito.engines.sglang import SGLangEngine
    from tito.render import build_renderer
    from tito.server.app import create_app
    from tito.stack import build_gateway

    class CannedSGLang(SGLangEngine):
        async def _request(self, method: str, path: str, body: bytes | None = None, *,
                           timeout: Any = None, headers: dict[str, str] | None = None
                           ) -> tuple[int, bytes]:
            await asyncio.sleep(0)  # the turn yields to the loop as on a socket
            if path == "/generate":
                return 200, reply
            if path == "/v1/models":
                return 200, b'{"data": [{"id": "bench", "max_model_len": 1048576}]}'
            return 404, b"{}"

    renderer = build_renderer("qwen3", tokenizer)
    config = ServerConfig(tokenizer=str(tokenizer), family="qwen3", engine="sglang",
                          engine_url="http://in-process")
    gateway = build_gateway(config, renderer=renderer, engine=CannedSGLang("http://in-process"))
    thread = renderer.tokenizer.start_fast_encoder()
    if thread is not None:
        thread.join()
    return create_app(gateway)


def floor_app(reply: bytes, prompt_lens: dict[str, int]) -> App:
    """The JSON work of a turn on the same sizes, nothing else."""
    import numpy as np
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def chat(request: Request) -> Response:
        data = orjson.loads(await request.body())
        sid = request.path_params["sid"]
        prompt = np.zeros(prompt_lens.get(sid, 0), dtype=np.int32)
        orjson.dumps({"input_ids": prompt, "max_new_tokens": data.get("max_tokens")},
                     option=orjson.OPT_SERIALIZE_NUMPY)
        await asyncio.sleep(0)
        engine = orjson.loads(reply)
        ids = engine["output_ids"]
        prompt_lens[sid] = len(prompt) + len(ids) + 80
        return Response(orjson.dumps({
            "id": "chatcmpl-bench", "object": "chat.completion", "model": "bench",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "x" * (4 * len(ids))}}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}}),
            media_type="application/json")

    async def new(request: Request) -> Response:
        return Response(orjson.dumps({"session_id": os.urandom(8).hex()}),
                        media_type="application/json")

    async def delete(request: Request) -> Response:
        return Response(status_code=204)

    return Starlette(routes=[Route("/sessions", new, methods=["POST"]),
                             Route("/sessions/{sid}/v1/chat/completions", chat,
                                   methods=["POST"]),
                             Route("/sessions/{sid}", delete, methods=["DELETE"])])


async def call(app: App, method: str, path: str, body: bytes = b"") -> Any:
    """One request to ``app`` as uvicorn would pass it; the decoded JSON reply."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 8000),
             "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # never disconnects
        raise AssertionError("unreachable")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status, data = sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])
    if status >= 300:
        raise RuntimeError(f"{method} {path} -> {status}: {data[:300]!r}")
    return orjson.loads(data) if data else None


async def run_sessions(app: App, wl: Any) -> int:
    """Every session of the workload, all at once; the number of turns answered."""
    answered = 0

    async def session(i: int) -> None:
        nonlocal answered
        sid = (await call(app, "POST", "/sessions"))["session_id"]
        messages = [dict(m) for m in wl.first_messages[i]]
        for _ in range(wl.turns):
            body = orjson.dumps({"model": "bench", "messages": messages,
                                 "max_tokens": wl.max_tokens})
            reply = await call(app, "POST", f"/sessions/{sid}/v1/chat/completions", body)
            message = reply["choices"][0]["message"]
            messages += [{k: v for k, v in message.items() if v is not None},
                         dict(wl.appended)]
            answered += 1
        await call(app, "DELETE", f"/sessions/{sid}")

    await asyncio.gather(*(session(i) for i in range(wl.sessions)))
    return answered


async def timed(app: App, wl: Any) -> float:
    """µs of CPU per turn of one run."""
    start = time.process_time()
    turns = await run_sessions(app, wl)
    return (time.process_time() - start) * 1e6 / max(1, turns)


async def measure(args: argparse.Namespace, wl: Any, apps: dict[str, App]
                  ) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {name: [] for name in apps}
    for app in apps.values():  # warm: templates, skeletons, caches
        await run_sessions(app, wl)
    for _ in range(max(1, args.repeat)):
        for name, app in apps.items():
            runs[name].append(await timed(app, wl))
    return runs


async def profile(app: App, wl: Any, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    await run_sessions(app, wl)
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats(os.environ.get("TITO_PROFILE_SORT", "cumulative")).print_stats(r"tito/", top)
    return out.getvalue()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from tito.heap import freeze_startup_heap, tune_for_serving
    from tito.render import build_renderer

    wl = build_workload(args.tokenizer, sessions=args.sessions, turns=args.turns,
                        input_tokens=args.input_tokens, output_tokens=args.output_tokens)
    reply = canned_reply(build_renderer("qwen3", args.tokenizer), args.output_tokens)
    tito = gateway_app(args.tokenizer, reply)
    apps = {"floor": floor_app(reply, {}), "tito": tito}
    tune_for_serving()  # the collector settings of ``tito serve`` (tito/heap.py)
    freeze_startup_heap()
    async with gateway_lifespan(tito):
        runs = await measure(args, wl, apps)
        text = await profile(tito, wl, args.profile) if args.profile else ""
    floor, ours = median(runs["floor"]), median(runs["tito"])
    paired = [t / f for f, t in zip(runs["floor"], runs["tito"], strict=True) if f]
    rows = [
        ["CPU per turn (µs), median", fmt(floor, 1), fmt(ours, 1), f"{ours / floor:.2f}x"],
        ["every run (µs)", " ".join(f"{v:.0f}" for v in runs["floor"]),
         " ".join(f"{v:.0f}" for v in runs["tito"]), "-"],
        ["tito / floor run by run, median", "-", "-", f"{median(paired):.2f}x"],
        ["tito's own work per turn (µs)", "-", fmt(ours - floor, 1), "-"],
    ]
    print_table(f"gateway in process: S={wl.sessions} T={wl.turns} I={wl.content_tokens} "
                f"O={wl.output_tokens}", ["", "floor", "tito", "tito / floor"], rows,
                f"{args.repeat} alternated run(s) of each app; CPU from time.process_time; "
                "no sockets: the app is called as ASGI, the SGLang client answers a canned "
                "reply")
    if text:
        print(text)
    return {"floor_us_per_turn": runs["floor"], "tito_us_per_turn": runs["tito"],
            "ratio_of_medians": ours / floor, "paired_ratio_median": median(paired)}


@contextlib.asynccontextmanager
async def gateway_lifespan(app: Any) -> Any:
    async with app.router.lifespan_context(app):
        yield


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.tokenizer / "tokenizer.json").is_file():
        raise SystemExit(f"no tokenizer at {args.tokenizer} (--tokenizer)")
    figures = asyncio.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
