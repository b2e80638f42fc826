"""The one stack builder: engine + gateway + HTTP server (design §3).

``tito serve``, ``tito rollout``, the mock demo and in-process tests all start the stack
here: :func:`build_engine` makes the engine client (loading the embedded model, or
spawning a ``tito mock-engine`` child for ``engine="mock"``), :func:`build_gateway`
verifies the family's renderer and builds the :class:`Gateway`, and :func:`start_stack`
serves it with :class:`tito.net.AppServer` on a socket from :func:`tito.net.bind_tcp`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace

from tito.config import ServerConfig, engine_targets
from tito.launch import ServerProcess, start_mock_engine
from tito.net import AppServer, bind_tcp
from tito.render import build_renderer
from tito.render.base import TemplateRenderer
from tito.render.verify import verify_renderer
from tito.server.app import create_app
from tito.server.gateway import Gateway
from tito.types.engine import Engine
from tito.types.errors import ConfigError
from tito.types.tokenizer import Tokenizer

log = logging.getLogger("tito.stack")

EMBEDDED_FAMILY = "chatml"
"""The embedded model's family (SmolLM2 speaks ChatML)."""


def default_family(engine: str) -> str:
    return EMBEDDED_FAMILY if engine == "embedded" else "default"


def build_engine(config: ServerConfig) -> Engine:
    """The engine client for ``config`` (embedded: loads the model, seconds)."""
    if config.engine == "embedded":
        from tito.engines.embedded import EmbeddedEngine  # imports torch: only here

        return EmbeddedEngine()
    from tito.engines.sglang import SGLangEngine

    if not config.engine_url:
        raise ConfigError(f"--engine {config.engine} has no engine URL")

    def client(kind: str, url: str) -> Engine:
        if kind == "vllm":
            from tito.engines.vllm import VLLMEngine

            return VLLMEngine(url, timeout=config.engine_timeout, lora_name=config.lora_name)
        return SGLangEngine(url, timeout=config.engine_timeout, lora_path=config.lora_name,
                            stream_interval=config.stream_interval)

    targets = engine_targets(config)
    if len(targets) == 1 and config.engine_max_inflight is None:
        return client(*targets[0])
    from tito.engines.pool import EnginePool

    return EnginePool([(url, client(kind, url)) for kind, url in targets],
                      max_inflight=config.engine_max_inflight)


def build_gateway(config: ServerConfig, *, renderer: TemplateRenderer | None = None,
                  engine: Engine | None = None) -> Gateway:
    """Validate ``config``, build what is missing, run the append-only self-check."""
    config.validate()
    if engine is None:
        engine = build_engine(config)
    if renderer is None:
        tokenizer: Tokenizer | str = config.tokenizer
        if config.engine == "embedded":
            tokenizer = engine.tokenizer  # type: ignore[attr-defined]
        renderer = build_renderer(config.family, tokenizer, chat_template=config.chat_template,
                                  stop_token=config.stop_token)
    report = verify_renderer(renderer).summary()
    if not report["passed"]:
        message = (f"family {config.family!r} failed the append-only self-check: "
                   f"{report['first_failure']}")
        if config.strict_template:
            raise ConfigError(message, code="template_not_append_only")
        log.warning("%s (serving anyway; --strict-template refuses)", message)
    return Gateway(config, renderer, engine, self_check=report)


@dataclass
class Stack:
    """A running engine + gateway; :meth:`close` stops both."""

    gateway: Gateway
    server: AppServer
    engine: str
    """What was asked for: ``embedded``, ``sglang`` or ``mock``."""
    engine_process: ServerProcess | None = None
    """The ``tito mock-engine`` child, with ``engine="mock"``."""

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def description(self) -> str:
        config = self.gateway.config
        where = {"embedded": "embedded SmolLM2-135M",
                 "mock": f"mock engine at {config.engine_url}",
                 "sglang": "sglang at " + ", ".join((config.engine_url or "",
                                                     *config.extra_engine_urls)),
                 "vllm": "vLLM at " + ", ".join((config.engine_url or "",
                                                 *config.extra_engine_urls))}[self.engine]
        return f"{where}, family {config.family}"

    async def close(self) -> None:
        await self.server.stop()  # its lifespan closes the engine client
        if self.engine_process is not None:
            await asyncio.to_thread(self.engine_process.stop)


async def _spawn_mock_engine(config: ServerConfig) -> ServerProcess:
    """``tito mock-engine`` in its own process group; stopped again if we are cancelled
    while it starts (it would not get the terminal's Ctrl-C)."""
    spawn = asyncio.ensure_future(asyncio.to_thread(
        start_mock_engine, config.tokenizer, config.family, "--log-level", "warning",
        own_session=True, timeout=60.0))
    try:
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            process = await spawn
            await asyncio.to_thread(process.stop)
        raise


async def start_stack(config: ServerConfig, *, handle_signals: bool = False) -> Stack:
    """Start the engine and serve the gateway on ``config.host:config.port`` (0: free).

    ``engine="mock"`` spawns ``tito mock-engine`` in its own process group (Ctrl-C is the
    caller's to relay). Config errors raise :class:`ConfigError` before anything starts;
    on any failure what was started is stopped again.
    """
    config.validate()
    kind = config.engine
    try:
        sock = bind_tcp(config.host, config.port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {config.host}:{config.port}: {exc}") from exc
    engine_process: ServerProcess | None = None
    engine: Engine | None = None
    try:
        if kind == "mock":
            engine_process = await _spawn_mock_engine(config)
            config = replace(config, engine="sglang", engine_url=engine_process.url)
        engine = await asyncio.to_thread(build_engine, config)
        gateway = await asyncio.to_thread(build_gateway, config, engine=engine)
        server = AppServer(create_app(gateway), sock, log_level=config.log_level,
                           access_log=config.access_log, handle_signals=handle_signals,
                           timeout_graceful_shutdown=5,
                           timeout_keep_alive=config.keepalive_timeout)
        await server.start()
    except BaseException:
        sock.close()
        if engine is not None:  # not yet owned by a running gateway (its lifespan closes it)
            with contextlib.suppress(Exception):
                await engine.close()
        if engine_process is not None:
            await asyncio.to_thread(engine_process.stop)
        raise
    return Stack(gateway, server, kind, engine_process)
