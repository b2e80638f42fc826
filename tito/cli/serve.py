"""``tito serve``: the gateway's flags; the stack builder (:mod:`tito.stack`) does the rest."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

from tito.cli.supervise import supervise
from tito.config import AFTER_LENGTH_CUT, COMPAT, HOSTED_TOOLS, IMAGES, SIDE_REQUESTS, ServerConfig
from tito.heap import freeze_startup_heap, one_malloc_arena, tune_for_serving
from tito.render import FAMILIES
from tito.session.matchers import BUILTIN
from tito.stack import Stack, default_family, start_stack
from tito.types.errors import TitoError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["embedded", "sglang", "vllm"], default=None,
                   help="inference engine behind the gateway (embedded: SmolLM2-135M-Instruct "
                        "on this CPU, in-process, with its own tokenizer; sglang: native "
                        "/generate, also what `tito mock-engine` speaks; vllm: a vLLM server's "
                        "/v1/completions with token ids). Unset: sglang when --engine-url is "
                        "given, else embedded")
    p.add_argument("--engine-url", action="append", default=None, metavar="URL",
                   help="base URL of the engine, e.g. http://127.0.0.1:30000; give it several "
                        "times to spread sessions over several engines")
    p.add_argument("--engine-max-inflight", type=int, default=None, metavar="N",
                   help="requests in flight per engine (more wait; default: no cap)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="run N gateway processes on consecutive ports from --port (sessions "
                        "are independent: a session id names its worker), supervised: a "
                        "worker that dies is started again")
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", default=None,
                   help="local folder with tokenizer.json (or vocab.json + merges.txt) and "
                        "the chat template; loaded offline (required unless --engine embedded)")
    p.add_argument("--family", default=None, choices=sorted(FAMILIES),
                   help="model family: its renderer, junction rule, stop ids and parser "
                        "(unset: chatml with --engine embedded, else default)")
    p.add_argument("--chat-template", default=None,
                   help="a chat template file (only with --family default)")
    p.add_argument("--stop-token", default=None,
                   help="end-of-turn token (only with --family default; default: the "
                        "template's own end marker, then the tokenizer's EOS)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free)")
    p.add_argument("--message-matcher", default="harness",
                   help=f"replay matcher: {', '.join(BUILTIN)}, or a trusted "
                        "module:function path")
    add_session_arguments(p)
    add_limit_arguments(p)
    add_service_arguments(p)


def add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """Caps on sessions, requests and turns."""
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
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="largest prompt sent to the engine, in tokens (400 prompt_too_long "
                        "above; unset: only --max-seq-len and the engine's context)")
    p.add_argument("--max-json-depth", type=int, default=64,
                   help="deepest JSON nesting accepted in a request field (400 above)")
    p.add_argument("--engine-timeout", type=float, default=600.0,
                   help="seconds to wait for one engine generation (504 after)")
    p.add_argument("--stream-interval", type=int, default=1, metavar="N",
                   help="output ids per engine stream chunk of a streamed turn (SGLang "
                        "stream_interval)")



def add_service_arguments(p: argparse.ArgumentParser) -> None:
    """How the server presents itself: name, checks, journal, access, logs."""
    p.add_argument("--served-model-name", default=None,
                   help="model name reported in responses (default tito-<family>)")
    p.add_argument("--strict-template", action="store_true",
                   help="refuse to start when the append-only self-check fails")
    p.add_argument("--journal", default=None, metavar="DIR",
                   help="write-ahead journal folder: every session creation, committed turn "
                        "and deletion is fsynced before the client is answered, and replayed "
                        "on start (sessions survive kill -9)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every route but /health "
                        "(default: $TITO_API_KEY, better: a flag's value is visible to "
                        "other users in ps; unset: no key)")
    p.add_argument("--allowed-hosts", default=None, metavar="H1,H2",
                   help="Host header names served, comma-separated ('*': any); default: "
                        "127.0.0.1, localhost, ::1 and --host")
    p.add_argument("--allowed-origins", default=None, metavar="O1,O2",
                   help="origins (scheme://host[:port]) a browser's request may come from "
                        "besides the gateway's own, comma-separated ('*': any); default: "
                        "only its own (same scheme, host and port)")
    p.add_argument("--access-log", action="store_true",
                   help="log one line per HTTP request (method, path, status)")
    p.add_argument("--keepalive-timeout", type=float, default=75.0, metavar="S",
                   help="seconds an idle client connection is kept open (above the 5 s "
                        "after which httpx and the openai/anthropic SDKs drop theirs, so "
                        "none reuses a connection the gateway is closing)")
    p.add_argument("--no-ui", action="store_true",
                   help="do not serve the trajectory viewer at /ui (404)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"], help="log verbosity")


def add_session_arguments(p: argparse.ArgumentParser) -> None:
    """The session-model and engine-control flags (shared with ``tito rollout``)."""
    p.add_argument("--session-version", default="v1", choices=["v1", "v2"],
                   help="session model: v1 linear sessions (retries roll back up to "
                        "--max-rollback turns); v2 trajectory trees that keep every branch")
    p.add_argument("--max-rollback", type=int, default=None, metavar="N",
                   help="v1: generated turns a request may abandon (default 1: a retry "
                        "of the latest turn; raise it for harnesses that compact history)")
    p.add_argument("--max-nodes", type=int, default=None, metavar="N",
                   help="v2: nodes per session tree (default 1024; more is 409 "
                        "node_cap_reached)")
    p.add_argument("--sample-picker", default=None, metavar="PATH",
                   help="v2: module:function choosing which leaf samples to train on "
                        "(default tito.samples.tree:drop_retries)")
    p.add_argument("--sample-postprocessor", default=None, metavar="PATH",
                   help="v2: module:function post-processing the picked samples "
                        "(default tito.samples.tree:train_once)")
    add_replay_arguments(p)
    add_request_arguments(p)


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    """Engine control and what the engine is asked to return for replay."""
    p.add_argument("--pause-generation-mode", default="retract",
                   choices=["retract", "abort", "in_place"],
                   help="how the engine pauses for a weight update (POST /pause without a "
                        "mode); routing replay is incremental in every mode but retract")
    p.add_argument("--routing-replay", action="store_true",
                   help="MoE routing replay (R3): ask the engine for routed experts and put "
                        "rollout_routed_experts in the samples")
    p.add_argument("--indexer-replay", action="store_true",
                   help="sparse-attention indexer replay: ask the engine for indexer top-k "
                        "(SGLang return_indexer_topk) and put rollout_indexer_topk in the "
                        "samples")
    p.add_argument("--sampling-mask-replay", action="store_true",
                   help="sampling-mask replay: ask the engine for the kept token set of "
                        "every generated position (top-k / top-p truncation; SGLang "
                        "return_sampling_mask) and put rollout_sampling_mask (int32 ids) and "
                        "rollout_sampling_mask_offsets (int64) in the samples")
    p.add_argument("--weight-versions-format", default="versions",
                   choices=["versions", "spans"],
                   help="samples' weight_versions: one version string per kept turn "
                        "(versions, the reference framework's merged wire) or per engine call "
                        "the {version, abs_start, abs_end} spans over tokens (spans, its "
                        "newer WeightVersionsPerCall); a samples request's "
                        "weight_versions_format overrides it")
    p.add_argument("--routing-layers", type=int, default=None, metavar="N",
                   help="layers per routed-experts row (default: num_hidden_layers of the "
                        "model's config.json in the --tokenizer folder)")
    p.add_argument("--lora-name", default=None, metavar="NAME",
                   help="LoRA adapter name put on every engine request (SGLang lora_path)")


def add_request_arguments(p: argparse.ArgumentParser) -> None:
    """How requests a text session cannot serve as sent, and compatibility, are handled."""
    p.add_argument("--hosted-tools", default="drop", choices=list(HOSTED_TOOLS),
                   help="hosted tools in a request (web_search, file search, computer use, "
                        "MCP servers: tools the gateway cannot run): drop leaves them out of "
                        "the render and notes it in the samples; error refuses the request")
    p.add_argument("--images", default="reject", choices=list(IMAGES),
                   help="images in a request: reject (400); placeholder renders each as a "
                        "fixed text marker, noted in the samples (a text model's rollout "
                        "survives)")
    p.add_argument("--side-requests", default="drop", choices=list(SIDE_REQUESTS),
                   help="side requests (no tools, and structured output or a title, on a "
                        "session whose main agent has tools): their own agent context, "
                        "served either way; drop leaves their samples out, keep returns them")
    p.add_argument("--after-length-cut", default=None, choices=list(AFTER_LENGTH_CUT),
                   help="a turn after a reply cut by finish_reason=length: keep (default) "
                        "accepts it and the sample holds every turn (the cut reply trains, its "
                        "closing token is bridge, metadata length_cut_turns lists it); refuse "
                        "(the default under --compat miles) answers 409 truncated_generation "
                        "before any engine call (the reference's rule: nothing is generated "
                        "that no sample holds)")
    p.add_argument("--compat", default="none", choices=list(COMPAT),
                   help="miles: behave as the reference framework's session server where a "
                        "client could depend on it (error bodies, 404 after delete, one-chunk "
                        "streaming, meta_info in replies, full records); none: tito's own")
    p.add_argument("--partial-rollout", action="store_true",
                   help="refused: partial rollout is not supported with sessions (any "
                        "version); accepted only to say so")


def session_config(args: argparse.Namespace) -> dict[str, Any]:
    return {"session_version": args.session_version, "max_rollback": args.max_rollback,
            "max_nodes": args.max_nodes, "sample_picker": args.sample_picker,
            "sample_postprocessor": args.sample_postprocessor,
            "pause_generation_mode": args.pause_generation_mode,
            "routing_replay": args.routing_replay, "routing_layers": args.routing_layers,
            "indexer_replay": args.indexer_replay,
            "sampling_mask_replay": args.sampling_mask_replay,
            "weight_versions_format": args.weight_versions_format,
            "lora_name": args.lora_name, "partial_rollout": args.partial_rollout,
            "hosted_tools": args.hosted_tools, "images": args.images,
            "side_requests": args.side_requests,
            "after_length_cut": args.after_length_cut
            or ("refuse" if args.compat == "miles" else "keep"),
            "compat": args.compat}


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    urls = [u.rstrip("/") for u in args.engine_url or ()]
    engine = args.engine or ("sglang" if urls else "embedded")
    family = args.family or default_family(engine)
    return ServerConfig(
        tokenizer=args.tokenizer or "", family=family, engine=engine,
        engine_url=urls[0] if urls else None, extra_engine_urls=tuple(urls[1:]),
        engine_max_inflight=args.engine_max_inflight, workers=args.workers,
        worker_index=args.worker_index or 0,
        chat_template=args.chat_template, stop_token=args.stop_token, host=args.host,
        port=args.port, message_matcher=args.message_matcher,
        **session_config(args), max_seq_len=args.max_seq_len,
        default_max_tokens=args.default_max_tokens, max_sessions=args.max_sessions,
        session_ttl=args.session_ttl, max_body_bytes=args.max_body_bytes,
        max_json_depth=args.max_json_depth, max_prompt_tokens=args.max_prompt_tokens,
        engine_timeout=args.engine_timeout, stream_interval=args.stream_interval,
        served_model_name=args.served_model_name,
        strict_template=args.strict_template, access_log=args.access_log, ui=not args.no_ui,
        keepalive_timeout=args.keepalive_timeout,
        journal=args.journal, api_key=args.api_key or os.environ.get("TITO_API_KEY") or None,
        allowed_hosts=None if args.allowed_hosts is None else
        tuple(args.allowed_hosts.split(",")),
        allowed_origins=None if args.allowed_origins is None else
        tuple(args.allowed_origins.split(",")),
        log_level=args.log_level,
    )


def run(args: argparse.Namespace) -> int:
    """``tito serve``: exit 2 on a configuration error, else serve until a signal."""
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
        if config.workers > 1 and args.worker_index is None:  # the user's tito serve
            config.validate()
            return supervise(config, sys.argv[1:])
        if config.engine != "embedded":  # the embedded engine's torch threads keep theirs
            one_malloc_arena()  # before any thread starts (tito.heap)
        return asyncio.run(serve(config))
    except TitoError as exc:  # a ConfigError, or a startup check that failed
        print(f"tito serve: {exc.message}", file=sys.stderr)
        return 2


async def serve(config: ServerConfig) -> int:
    """Serve until a signal. A worker of ``--workers N`` (started by the supervisor,
    :mod:`tito.cli.supervise`) checks its peers (``/health``, 421 or 503) and stops when
    its supervisor is gone."""
    stack = await start_stack(config, handle_signals=True)
    tune_for_serving()
    settle = asyncio.create_task(_freeze_when_built(stack))
    peers = stack.gateway.peers
    watch: asyncio.Task[None] | None = None
    try:
        if peers is not None:
            peers.start()
            watch = asyncio.create_task(_stop_when_orphaned(stack.server))
        print(f"tito serve listening on {stack.url}", flush=True)
        await stack.server.wait()
    finally:
        settle.cancel()
        if watch is not None:
            watch.cancel()
        if peers is not None:
            await peers.stop()
        await stack.close()
    return 0


async def _freeze_when_built(stack: Stack) -> None:
    """Freeze the startup heap (:mod:`tito.heap`) once it is complete: after the fast
    encoder's tables, built in a background thread, are there."""
    thread = stack.gateway.renderer.tokenizer.start_fast_encoder()
    if thread is not None:
        await asyncio.to_thread(thread.join)
    freeze_startup_heap()


async def _stop_when_orphaned(server: Any) -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    logging.getLogger("tito.server").warning("the supervisor (tito serve --workers) is "
                                             "gone: stopping")
    await server.stop()
