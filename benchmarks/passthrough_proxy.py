"""A minimal pass-through proxy: the floor of any gateway on our HTTP stack.

Same stack as ``tito serve``: Starlette on uvicorn (socket from :func:`tito.net.bind_tcp`,
so TCP_NODELAY is on), one pooled keep-alive aiohttp client session, orjson, and the same
garbage-collector settings (:mod:`tito.heap`). No
tokenization, no state, no validation: ``POST /generate`` bodies are parsed and
re-serialized with orjson (a gateway has to read both directions) and forwarded to the
upstream engine; the reply goes back the same way.

    python benchmarks/passthrough_proxy.py --upstream http://127.0.0.1:30000 --port 0
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import aiohttp
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tito.heap import freeze_startup_heap, tune_for_serving
from tito.net import bind_tcp, url_of


def create_app(upstream: str) -> Starlette:
    state: dict[str, aiohttp.ClientSession] = {}
    headers = {"content-type": "application/json"}

    def client() -> aiohttp.ClientSession:
        session = state.get("http")
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=1024, keepalive_timeout=600)
            session = state["http"] = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=600))
        return session

    async def generate(request: Request) -> Response:
        payload = orjson.loads(await request.body())
        async with client().post(upstream + "/generate", data=orjson.dumps(payload),
                                 headers=headers) as resp:
            status, raw = resp.status, await resp.read()
        return Response(orjson.dumps(orjson.loads(raw)), status_code=status,
                        media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return Starlette(routes=[Route("/generate", generate, methods=["POST"]),
                             Route("/health", health, methods=["GET"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="engine base URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    serve_app(create_app(args.upstream.rstrip("/")), args.host, args.port,
              "pass-through proxy")


def serve_app(app: Starlette, host: str, port: int, label: str) -> None:
    """Serve ``app`` as ``tito serve`` serves (its collector settings, tito/heap.py) and
    print ``<label> listening on URL`` once it is up."""
    sock = bind_tcp(host, port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           lifespan="off", timeout_graceful_shutdown=2))

    async def serve() -> None:
        tune_for_serving()
        freeze_startup_heap()
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.005)
        if server.started:
            print(f"{label} listening on {url_of(sock)}", flush=True)
        await task

    asyncio.run(serve())

if __name__ == "__main__":
    main()
