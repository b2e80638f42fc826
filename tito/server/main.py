"""``tito serve``: build the renderer, the engine client and the app, then run uvicorn."""

from __future__ import annotations

import argparse
import logging
import sys

from tito.config import ServerConfig
from tito.engines.base import Engine
from tito.errors import TitoError
from tito.render import FAMILIES, build_renderer
from tito.render.base import TemplateRenderer
from tito.render.verify import verify_renderer
from tito.server.app import create_app
from tito.server.gateway import Gateway
from tito.session.matchers import BUILTIN

log = logging.getLogger("tito.serve")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["embedded", "sglang"], default=None,
                   help="inference engine behind the gateway (embedded: SmolLM2-135M-Instruct "
                        "on this CPU, in-process, with its own tokenizer; sglang: native "
                        "/generate, also what `tito mock-engine` speaks). Unset: sglang when "
                        "--engine-url is given, else embedded")
    p.add_argument("--engine-url", help="base URL of the engine, e.g. http://127.0.0.1:30000")
    p.add_argument("--tokenizer", default=None,
                   help="local folder with tokenizer.json (or vocab.json + merges.txt) and "
                        "the chat template; loaded offline (required unless --engine embedded)")
    p.add_argument("--family", default=None, choices=sorted(FAMILIES),
                   help="model family: its renderer, junction rule, stop ids and parser "
                        "(unset: chatml with --engine embedded, else default)")
    p.add_argument("--chat-template", default=None,
                   help="a chat template file (only with --family default)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free)")
    p.add_argument("--message-matcher", default="strict",
                   help=f"replay matcher: {', '.join(BUILTIN)}, or a trusted "
                        "module:function path")
    p.add_argument("--session-version", default="v1", choices=["v1"],
                   help="session model: v1 linear sessions with one-step retry rollback")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="cap on prompt + completion tokens of a turn, and the default "
                        "truncation length of samples")
    p.add_argument("--default-max-tokens", type=int, default=1024,
                   help="max_tokens of a request that sets none")
    p.add_argument("--max-sessions", type=int, default=10_000,
                   help="live sessions at most; creating more is 429")
    p.add_argument("--session-ttl", type=float, default=3600.0,
                   help="seconds after which an idle session is dropped")
    p.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024,
                   help="largest accepted request body (413 above)")
    p.add_argument("--engine-timeout", type=float, default=600.0,
                   help="seconds to wait for one engine generation (504 after)")
    p.add_argument("--served-model-name", default=None,
                   help="model name reported in responses (default tito-<family>)")
    p.add_argument("--strict-template", action="store_true",
                   help="refuse to start when the append-only self-check fails")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"], help="log verbosity")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    engine = args.engine or ("sglang" if args.engine_url else "embedded")
    family = args.family or ("chatml" if engine == "embedded" else "default")
    return ServerConfig(
        tokenizer=args.tokenizer or "", family=family, engine=engine,
        engine_url=args.engine_url, chat_template=args.chat_template, host=args.host,
        port=args.port, message_matcher=args.message_matcher,
        session_version=args.session_version, max_seq_len=args.max_seq_len,
        default_max_tokens=args.default_max_tokens, max_sessions=args.max_sessions,
        session_ttl=args.session_ttl, max_body_bytes=args.max_body_bytes,
        engine_timeout=args.engine_timeout, served_model_name=args.served_model_name,
        strict_template=args.strict_template,
    )


def build_engine(config: ServerConfig) -> Engine:
    if config.engine == "embedded":
        from tito.engines.embedded import EmbeddedEngine  # imports torch: only here

        return EmbeddedEngine()
    from tito.engines.sglang import SGLangEngine

    assert config.engine_url is not None
    return SGLangEngine(config.engine_url, timeout=config.engine_timeout)


def build_gateway(config: ServerConfig, *, renderer: TemplateRenderer | None = None,
                  engine: Engine | None = None) -> Gateway:
    config.validate()
    if engine is None:
        engine = build_engine(config)
    if renderer is None:
        tokenizer = getattr(engine, "tokenizer", None) if config.engine == "embedded" \
            else config.tokenizer
        renderer = build_renderer(config.family, tokenizer,
                                  chat_template=config.chat_template)
    report = verify_renderer(renderer).summary()
    if not report["passed"]:
        message = (f"family {config.family!r} failed the append-only self-check: "
                   f"{report['first_failure']}")
        if config.strict_template:
            raise TitoError(message, code="template_not_append_only")
        log.warning("%s (serving anyway; --strict-template refuses)", message)
    return Gateway(config, renderer, engine, self_check=report)


def run(args: argparse.Namespace) -> int:
    from tito.net import bind_tcp, serve_forever

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        gateway = build_gateway(config_from_args(args))
    except TitoError as exc:
        print(f"tito serve: {exc.message}", file=sys.stderr)
        return 2
    app = create_app(gateway)
    try:
        sock = bind_tcp(args.host, args.port)
    except OSError as exc:
        print(f"tito serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    serve_forever(app, sock, name="tito serve", log_level=args.log_level,
                  timeout_graceful_shutdown=5)
    return 0
