"""``tito mock-engine``: an SGLang-compatible, scriptable mock engine on this CPU.

The engine itself is :mod:`tito.engines.mock`; this module parses its flags and serves it
with uvicorn, printing ``tito mock-engine listening on http://HOST:PORT`` once it accepts
connections.
"""

from __future__ import annotations

import argparse
import sys

from tito.engines.mock import FAULT_MODES, MockConfig, build_engine, parse_fault
from tito.net import bind_tcp, serve_forever


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``tito mock-engine``."""
    parser.add_argument("--tokenizer", required=True, metavar="DIR",
                        help="tokenizer folder (tokenizer.json or vocab.json + merges.txt) "
                             "used to decode prompts and render the scripted replies")
    parser.add_argument("--family", default="qwen3",
                        help="model family whose renderer writes the replies (qwen3, chatml, "
                             "smollm2, default)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=30000,
                        help="port to listen on (0: pick a free port); the bound address is "
                             "printed as 'tito mock-engine listening on http://HOST:PORT'")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="simulated prefill latency per request, in milliseconds")
    parser.add_argument("--token-latency-ms", type=float, default=0.0,
                        help="simulated decode latency per output token, in milliseconds "
                             "(requests run concurrently and can be aborted mid-generation)")
    parser.add_argument("--context-length", type=int, default=32768,
                        help="model context length: longer prompts (or prompt + "
                             "max_new_tokens) are rejected with SGLang's 400 messages")
    parser.add_argument("--weight-version", default="default",
                        help="initial weight version reported in meta_info.weight_version "
                             "(changed by POST /update_weight_version)")
    parser.add_argument("--served-model-name", default=None,
                        help="model name in /v1/models and /model_info (unset: the "
                             "tokenizer folder)")
    parser.add_argument("--enable-return-routed-experts", action="store_true",
                        help="serve fake MoE routing replay (meta_info.routed_experts) to "
                             "requests with return_routed_experts; omitted otherwise, as SGLang")
    parser.add_argument("--num-layers", type=int, default=4,
                        help="fake MoE layers per routed-experts row")
    parser.add_argument("--topk", type=int, default=2,
                        help="fake experts per token per layer in routed-experts rows")
    parser.add_argument("--num-experts", type=int, default=16,
                        help="fake number of experts (routed expert ids are in [0, N))")
    parser.add_argument("--enable-return-indexer-topk", action="store_true",
                        help="serve fake sparse-attention indexer replay "
                             "(meta_info.indexer_topk, indexer_topk_num_layers) to requests "
                             "with return_indexer_topk, rows from routed_experts_start_len")
    parser.add_argument("--indexer-layers", type=int, default=2,
                        help="fake indexer layers per indexer row")
    parser.add_argument("--indexer-topk", type=int, default=4,
                        help="fake indexer top-k per layer (positions in [0, row))")
    parser.add_argument("--request-log-size", type=int, default=1000,
                        help="requests kept in the GET /mock/requests log (oldest dropped; "
                             "0: unbounded)")
    parser.add_argument("--keepalive-timeout", type=float, default=5.0, metavar="S",
                        help="seconds an idle keep-alive connection is kept open (uvicorn's "
                             "timeout_keep_alive; 5 is uvicorn's and SGLang's default)")
    parser.add_argument("--fault", action="append", default=[], metavar="MODE[:ARG]",
                        help="inject a failure into every /generate reply (repeatable; one "
                             "request: a 'FAULT <mode> [<arg>]' directive line); modes: "
                             + ", ".join(FAULT_MODES))
    _decoding_arguments(parser)
    parser.add_argument("--log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn log level")


def _decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """How the fake decoding reports itself (speculative counters, stream chunks)."""
    parser.add_argument("--speculative-num-draft-tokens", type=int, default=0, metavar="N",
                        help="fake speculative decoding with N draft tokens per verify step "
                             "(SGLang's flag of that name): final meta_info carries "
                             "spec_verify_ct, spec_num_correct_drafts and "
                             "spec_num_proposed_drafts; 0 (default): off")
    parser.add_argument("--incremental-streaming-output", action="store_true",
                        help="stream chunks carry the ids, logprobs and text since the "
                             "previous chunk (SGLang's flag of that name); default: every "
                             "chunk carries everything so far, as SGLang's default")


def config_from_args(args: argparse.Namespace) -> MockConfig:
    return MockConfig(
        tokenizer_dir=args.tokenizer, family=args.family, latency_ms=args.latency_ms,
        token_latency_ms=args.token_latency_ms, context_length=args.context_length,
        weight_version=args.weight_version, served_model_name=args.served_model_name,
        enable_return_routed_experts=args.enable_return_routed_experts,
        num_layers=args.num_layers, topk=args.topk, num_experts=args.num_experts,
        enable_return_indexer_topk=args.enable_return_indexer_topk,
        indexer_layers=args.indexer_layers, indexer_topk=args.indexer_topk,
        request_log_size=args.request_log_size, keepalive_timeout=args.keepalive_timeout,
        faults=tuple(args.fault),
        speculative_num_draft_tokens=args.speculative_num_draft_tokens,
        incremental_streaming_output=args.incremental_streaming_output,
    )


def config_problem(config: MockConfig) -> str | None:
    """Why ``config`` cannot be served (None: it can)."""
    if config.topk < 1 or config.num_layers < 1 or config.topk > config.num_experts:
        return "need 1 <= --topk <= --num-experts and --num-layers >= 1"
    if config.speculative_num_draft_tokens < 0:
        return "--speculative-num-draft-tokens must be 0 (off) or more"
    if config.context_length < 2:
        return "--context-length must be at least 2"
    if not config.keepalive_timeout > 0:
        return "--keepalive-timeout must be more than 0"
    for spec in config.faults:
        try:
            parse_fault(spec)
        except ValueError as exc:
            return f"--fault {spec}: {exc}"
    return None


def run(args: argparse.Namespace) -> int:
    """Run the mock engine until interrupted."""
    config = config_from_args(args)
    problem = config_problem(config)
    if problem is not None:
        print(f"tito mock-engine: {problem}", file=sys.stderr)
        return 2
    try:
        engine = build_engine(config)
    except Exception as exc:  # a bad tokenizer folder or family: a clean CLI error
        print(f"tito mock-engine: {exc}", file=sys.stderr)
        return 2
    try:
        sock = bind_tcp(args.host, args.port)
    except OSError as exc:
        print(f"tito mock-engine: cannot listen on {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 2
    serve_forever(engine.app(), sock, name="tito mock-engine", log_level=args.log_level,
                  timeout_graceful_shutdown=2, **engine.server_options())
    return 0
