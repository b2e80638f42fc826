"""The mock engine's HTTP routes (Starlette): SGLang's native API plus two test hooks."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tito.engines.mock.contract import ContractError, RequestError, is_int
from tito.engines.mock.directives import MockModel
from tito.engines.mock.faults import Fault, fault_delay, parse_fault
from tito.engines.mock.faulty import RAW_SEND, faulty_response
from tito.engines.mock.lifecycle import PAUSE_MODES, Lifecycle, MockConfig, ReqState
from tito.engines.mock.replies import Replies
from tito.engines.mock.streaming import MockStream, streams_normally

FLUSH_TEXT = ("Cache flushed.\nPlease check backend logs for more details. (When there are "
              "running or waiting requests, the operation will not be performed.)\n")


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _contract_error(text: str) -> Response:
    return _json({"error": text}, 400)


def _value_error(message: str) -> Response:
    return _json({"error": {"message": message}}, 400)


async def _body(request: Request) -> dict[str, Any]:
    """A control route's JSON object body; anything else reads as ``{}``."""
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


class _App(Starlette):
    """Starlette that keeps the server's own ``send`` in the scope (fault ``reset`` closes
    the connection through it)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[RAW_SEND] = send
        await super().__call__(scope, receive, send)


class MockEngine:
    """State and routes of one mock engine process."""

    def __init__(self, config: MockConfig, model: MockModel):
        self.config = config
        self.model = model
        self.tokenizer = model.tokenizer
        self.core = Lifecycle(config, model)
        self.replies = Replies(config, model.tokenizer)
        self.served_model_name = config.served_model_name or config.tokenizer_dir
        self.faults = tuple(parse_fault(spec) for spec in config.faults)

    def server_options(self) -> dict[str, Any]:
        """uvicorn options this engine is served with (:class:`tito.net.AppServer`)."""
        return {"timeout_keep_alive": self.config.keepalive_timeout}

    def _result(self, req: ReqState, *, final: bool, upto: int | None = None) -> dict[str, Any]:
        return self.replies.result(req, self.core.weight_version, final=final, upto=upto)

    # -- generation ------------------------------------------------------------------------
    async def generate(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return _contract_error(f"{exc}")
        try:
            req = self.core.admit(body)
        except ContractError as exc:
            return _contract_error(str(exc))
        except RequestError as exc:
            return _value_error(str(exc))
        req.log["routing_key"] = request.headers.get("x-smg-routing-key")
        self.core.register(req)
        if body.get("stream"):
            faults = self._faults(req, planned=False)
            if streams_normally(faults):
                stream = MockStream(self.core, self.replies, req, faults,
                                    self.config.incremental_streaming_output, request)
                return StreamingResponse(stream.events(), media_type="text/event-stream")
        faults = await self._run(request, req)
        if faults:
            return await faulty_response(request, self._result(req, final=True), faults,
                                         vocab_size=self.tokenizer.vocab_size)
        return _json(self._result(req, final=True))

    async def _run(self, request: Request, req: ReqState) -> tuple[Fault, ...]:
        """Generate ``req`` to the end (a client that goes away aborts it); its faults."""
        watcher = None
        if self.config.latency_ms > 0 or self.config.token_latency_ms > 0 or self.core.paused:
            watcher = asyncio.create_task(self._watch_disconnect(request, req))
        try:
            async for _ in self.core.drive(req):
                pass
            faults = self._faults(req)
            delay = fault_delay(faults)
            if delay > 0:
                watcher = watcher or asyncio.create_task(self._watch_disconnect(request, req))
                await self.core.sleep(req, delay)
        finally:
            self.core.finish(req)
            if watcher is not None:
                watcher.cancel()
        return faults

    def _faults(self, req: ReqState, *, planned: bool = True) -> tuple[Fault, ...]:
        """The engine's faults and those the request's directives ask for (logged);
        ``planned=False``: read the directives from the prompt (a stream decides how
        to answer before its completion is planned)."""
        if planned:
            asked = req.plan.faults if req.plan is not None else ()
        else:
            asked = tuple(self.model.script(req.input_ids).faults)
        faults = self.faults + asked
        if faults:
            req.log["faults"] = [f.spec for f in faults]
        return faults

    async def _watch_disconnect(self, request: Request, req: ReqState) -> None:
        """A client that goes away aborts its request (SGLang notices within ~4 s)."""
        while not req.finished:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                if not req.finished:
                    self.core.abort(req)
                return

    # -- control ---------------------------------------------------------------------------
    async def abort_request(self, request: Request) -> Response:
        body = await _body(request)
        rid = body.get("rid")
        self.core.abort_matching(rid if isinstance(rid, str) else "",
                                 abort_all=bool(body.get("abort_all")))
        return Response(status_code=200)

    async def pause_generation(self, request: Request) -> Response:
        body = await _body(request)
        mode = body.get("mode") or "abort"
        if mode not in PAUSE_MODES:
            return _json({"detail": f"unknown pause mode {mode!r}"}, 422)
        self.core.pause(mode)
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: Request) -> Response:
        self.core.resume()
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weight_version(self, request: Request) -> Response:
        body = await _body(request)
        version = body.get("new_version")
        if not isinstance(version, str):
            return _json({"detail": "new_version must be a string"}, 422)
        if body.get("abort_all_requests"):
            self.core.abort_all()
        self.core.weight_version = version
        return _json({"success": True, "message": f"Weight version updated to {version}",
                      "new_version": version})

    async def flush_cache(self, request: Request) -> Response:
        if self.core.in_flight:
            return Response(FLUSH_TEXT, status_code=400, media_type="text/plain")
        self.core.cache.clear()
        return Response(FLUSH_TEXT, status_code=200, media_type="text/plain")

    # -- information -----------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=503 if self.core.paused else 200)

    async def model_info(self, request: Request) -> Response:
        cfg = self.config
        return _json({
            "model_path": cfg.tokenizer_dir,
            "served_model_name": self.served_model_name,
            "tokenizer_path": cfg.tokenizer_dir,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.core.weight_version,
            "load_format": "dummy",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "mock",
            "architectures": ["MockForCausalLM"],
            "mock": {"family": cfg.family, "context_length": cfg.context_length,
                     "num_hidden_layers": cfg.num_layers, "num_experts_per_tok": cfg.topk,
                     "num_experts": cfg.num_experts,
                     "enable_return_routed_experts": cfg.enable_return_routed_experts},
        })

    async def server_info(self, request: Request) -> Response:
        cfg = self.config
        return _json({
            "version": "0.5.23-tito-mock",
            "model_path": cfg.tokenizer_dir,
            "served_model_name": self.served_model_name,
            "context_length": cfg.context_length,
            "weight_version": self.core.weight_version,
            "enable_return_routed_experts": cfg.enable_return_routed_experts,
            "incremental_streaming_output": cfg.incremental_streaming_output,
            "stream_interval": 1,
            "internal_states": [{"paused": self.core.paused,
                                 "in_flight": len(self.core.in_flight)}],
        })

    async def models(self, request: Request) -> Response:
        name = self.served_model_name
        return _json({"object": "list", "data": [{
            "id": name, "object": "model", "created": 0, "owned_by": "sglang", "root": name,
            "parent": None, "max_model_len": self.config.context_length}]})

    async def tokenize(self, request: Request) -> Response:
        body = await _body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            tokens: Any = [self.tokenizer.encode(p) for p in prompt]
            count: Any = [len(t) for t in tokens]
        elif isinstance(prompt, str):
            tokens = self.tokenizer.encode(prompt)
            count = len(tokens)
        else:
            return _value_error("prompt must be a string or a list of strings")
        return _json({"tokens": tokens, "count": count,
                      "max_model_len": self.config.context_length})

    async def detokenize(self, request: Request) -> Response:
        body = await _body(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(is_int(t) for t in tokens):
            return _value_error("tokens must be a list of integers")
        skip = body.get("skip_special_tokens", True)
        return _json({"text": self.tokenizer.decode(tokens, skip_special_tokens=bool(skip))})

    async def mock_requests(self, request: Request) -> Response:
        log = self.core.log
        if request.method == "DELETE":
            n = len(log)
            log.clear()
            return _json({"cleared": n})
        return _json(list(log))

    def app(self) -> Starlette:
        routes = [
            Route("/generate", self.generate, methods=["POST", "PUT"]),
            Route("/abort_request", self.abort_request, methods=["POST"]),
            Route("/pause_generation", self.pause_generation, methods=["POST"]),
            Route("/continue_generation", self.continue_generation, methods=["POST"]),
            Route("/update_weight_version", self.update_weight_version, methods=["POST"]),
            Route("/flush_cache", self.flush_cache, methods=["GET", "POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/health_generate", self.health, methods=["GET"]),
            Route("/ready", self.ready, methods=["GET"]),
            Route("/model_info", self.model_info, methods=["GET"]),
            Route("/get_model_info", self.model_info, methods=["GET"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/get_server_info", self.server_info, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/v1/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/v1/detokenize", self.detokenize, methods=["POST"]),
            Route("/mock/requests", self.mock_requests, methods=["GET", "DELETE"]),
        ]
        return _App(routes=routes)


def build_engine(config: MockConfig) -> MockEngine:
    """A mock engine whose replies the ``config.family`` renderer writes."""
    from tito.render import build_renderer

    renderer = build_renderer(config.family, config.tokenizer_dir)
    return MockEngine(config, MockModel(renderer))
