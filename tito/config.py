"""Gateway configuration: one dataclass and its rules (design §9).

The CLI (`tito serve`, `tito rollout`) and the Python API fill a :class:`ServerConfig`;
:meth:`ServerConfig.validate` applies :data:`RULES` before anything starts. A rule is
data — what it checks, whether it is an error or a warning, and a message that names the
flags involved and the fix. An error raises :class:`tito.types.errors.ConfigError` (the
CLI's exit status 2, never an HTTP error); warnings are logged and returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tito.types.errors import ConfigError
from tito.types.origins import bad_origin
from tito.types.placement import MAX_WORKERS

log = logging.getLogger("tito.config")

SESSION_VERSIONS = ("v1", "v2")
ENGINES = ("embedded", "sglang", "vllm", "mock")
REMOTE_ENGINES = ("sglang", "vllm")
"""Engines reached at ``--engine-url``."""
"""embedded: SmolLM2 in this process; sglang: a server at ``engine_url``; mock: a
``tito mock-engine`` child process started by the stack (``tito rollout``, the demo)."""
PAUSE_MODES = ("retract", "abort", "in_place")
HOSTED_TOOLS = ("drop", "error")
"""What a request's hosted tools (``web_search``, file search, computer use, MCP servers:
tools the gateway cannot run) become: left out of the render and noted, or a 400."""
COMPAT = ("none", "miles")
"""``miles``: the reference framework's session server where a client could depend on
it (docs/miles.md#compatibility-mode); ``none``: tito's own behaviour."""
IMAGES = ("reject", "placeholder")
"""What an image in a request becomes: a 400 naming it, or a fixed text marker."""
SIDE_REQUESTS = ("drop", "keep")
"""Whether side requests' samples (title and structured-output requests of a session
whose main agent has tools, design §5.5) are returned."""
AFTER_LENGTH_CUT = ("keep", "refuse")
"""``--after-length-cut``: the turns after a ``finish_reason=length`` cut are kept in the
sample, or the next turn after a cut is refused (409 ``truncated_generation``)."""


@dataclass
class ServerConfig:
    tokenizer: str
    family: str = "default"
    engine: str = "sglang"
    engine_url: str | None = None
    extra_engine_urls: tuple[str, ...] = ()
    """More engines (``--engine-url`` given several times): sessions are spread over all."""
    engine_max_inflight: int | None = None
    """Requests in flight per engine (more wait); None: no cap."""
    workers: int = 1
    """Gateway processes on consecutive ports from ``port`` (``--workers``)."""
    worker_index: int = 0
    """This process's index among ``workers`` (0: the one started by the user)."""
    chat_template: str | None = None
    stop_token: str | None = None
    """End-of-turn token of a ``default`` template (None: its own marker, then EOS)."""
    host: str = "127.0.0.1"
    port: int = 8000
    message_matcher: str = "harness"
    """How a replayed message is found to be the stored one (design §5.3)."""
    session_version: str = "v1"
    max_rollback: int | None = None
    """v1: generated turns one request may abandon (None: 1)."""
    max_nodes: int | None = None
    """v2: nodes per session tree (None: 1024)."""
    sample_picker: str | None = None
    """v2: dotted path of the leaf-sample picker (None: ``drop_retries``)."""
    sample_postprocessor: str | None = None
    """v2: dotted path of the sample postprocessor (None: ``train_once``)."""
    max_seq_len: int | None = None
    default_max_tokens: int = 1024
    max_sessions: int = 10_000
    session_ttl: float = 3600.0
    max_body_bytes: int = 32 * 1024 * 1024
    max_prompt_tokens: int | None = None
    """Largest prompt sent to the engine (400 ``prompt_too_long`` above)."""
    max_json_depth: int = 64
    """Deepest JSON nesting accepted in any request field (400 ``json_too_deep``)."""
    engine_timeout: float = 600.0
    stream_interval: int = 1
    """Output ids per engine stream chunk of a streamed turn (SGLang ``stream_interval``)."""
    served_model_name: str | None = None
    strict_template: bool = False
    journal: str | None = None
    """Folder of the write-ahead journal that makes sessions survive a crash."""
    api_key: str | None = None
    """Required as ``Authorization: Bearer KEY`` on every route but ``/health``."""
    allowed_hosts: tuple[str, ...] | None = None
    """``Host`` names served (``*``: any); None: loopback names and ``host``."""
    allowed_origins: tuple[str, ...] | None = None
    """Origins (``scheme://host[:port]``) a browser's request may come from besides the
    gateway's own (``*``: any); None: only its own."""
    access_log: bool = False
    """One log line per HTTP request (uvicorn's access log)."""
    keepalive_timeout: float = 75.0
    """Seconds an idle client connection is kept open (uvicorn's ``timeout_keep_alive``),
    well above the 5 s after which httpx and the openai/anthropic SDKs drop theirs (and
    aiohttp's 15 s): a client never reuses a connection the gateway is closing."""
    ui: bool = True
    """Serve the trajectory viewer at ``/ui`` (``--no-ui``: 404)."""
    log_level: str = "info"
    pause_generation_mode: str = "retract"
    """How the engine pauses for a weight update: ``retract``, ``abort`` or ``in_place``;
    routing replay is incremental in every mode but ``retract``."""
    routing_replay: bool = False
    """Ask the engine for MoE routed experts (R3) and put them in the samples."""
    indexer_replay: bool = False
    """Ask the engine for sparse-attention indexer top-k (DeepSeek NSA-style) and put
    ``rollout_indexer_topk`` in the samples."""
    sampling_mask_replay: bool = False
    """Ask the engine for the kept token set of every generated position (top-k / top-p /
    min-p survivors; SGLang ``return_sampling_mask``) and put ``rollout_sampling_mask``
    in the samples."""
    weight_versions_format: str = "versions"
    """The samples' ``weight_versions`` when a samples request does not say: ``versions``
    (a version string per kept turn) or ``spans`` (per-call ``{version, abs_start,
    abs_end}`` spans, the reference framework's newer ``WeightVersionsPerCall``)."""
    routing_layers: int | None = None
    """Layers per routed-experts row (None: ``num_hidden_layers`` of the model's
    ``config.json`` in the tokenizer folder)."""
    lora_name: str | None = None
    """LoRA adapter name put on every engine request (SGLang ``lora_path``)."""
    hosted_tools: str = "drop"
    """``drop``: hosted tools are left out of the render, noted in the turn
    (``tito_turn_notes``) and logged once per session; ``error``: 400 ``unsupported_tool``."""
    compat: str = "none"
    """``miles``: error bodies ``{"error": "<text>"}`` with the reference's wording, 404
    for a deleted session, one-chunk streaming, ``meta_info`` in chat replies and the
    records' ``request``/``response`` by default (docs/miles.md)."""
    images: str = "reject"
    """``reject``: an image in a request is 400 ``unsupported_content``; ``placeholder``:
    each image is rendered as a fixed text marker (noted in the turn)."""
    side_requests: str = "drop"
    """``drop``: side requests (their own agent contexts, role ``side``) are served and
    kept in the session, but their samples are not returned; ``keep``: they are."""
    after_length_cut: str = "keep"
    """``keep``: a turn may extend a reply cut by ``finish_reason=length`` and the sample
    holds every turn (the cut turn's ids train, its closing token is bridge); ``refuse``:
    extending a cut reply is 409 ``truncated_generation``, before any engine call (the
    reference framework's rule)."""
    partial_rollout: bool = False
    """Partial rollout (a trajectory resumed across rollout steps): never supported with
    sessions; present so that a caller asking for it is told so."""

    @property
    def incremental_routing(self) -> bool:
        """Routing rows are requested only after the stored prefix (every pause mode but
        ``retract``, which may recompute the prefix's rows)."""
        return self.replay and self.pause_generation_mode != "retract"

    @property
    def replay(self) -> bool:
        """Routing or indexer replay is on."""
        return self.routing_replay or self.indexer_replay

    def validate(self) -> list[str]:
        """Apply :data:`RULES`: raise :class:`ConfigError` on the first error, log and
        return the warnings."""
        return check(self)


@dataclass(frozen=True, slots=True)
class Rule:
    """One configuration rule: ``broken(config)`` is true when the rule is violated."""

    name: str
    broken: Callable[[ServerConfig], bool]
    message: Callable[[ServerConfig], str]
    level: Literal["error", "warning"] = "error"


def _no_mask_reason(engine: str) -> str:
    if engine == "vllm":
        return ("vLLM returns sampling masks only on its /inference/v1/generate route "
                "(--return-sampling-mask), and the gateway reaches vLLM through "
                "/v1/completions, which does not carry them")
    return "the embedded engine does not report its sampling support"


def _replay_flags(c: ServerConfig) -> str:
    return " and ".join(f for f, on in (("--routing-replay", c.routing_replay),
                                        ("--indexer-replay", c.indexer_replay)) if on)


def _v2_only(c: ServerConfig) -> str | None:
    for flag, value in (("--max-nodes", c.max_nodes), ("--sample-picker", c.sample_picker),
                        ("--sample-postprocessor", c.sample_postprocessor)):
        if value is not None:
            return flag
    return None


RULES: tuple[Rule, ...] = (
    Rule("session_version", lambda c: c.session_version not in SESSION_VERSIONS,
         lambda c: f"--session-version {c.session_version!r} is not a session version; use "
                   "v1 (linear) or v2 (tree)"),
    Rule("partial_rollout", lambda c: c.partial_rollout,
         lambda c: f"--partial-rollout is not supported with sessions (--session-version "
                   f"{c.session_version}; no session version supports it): a session's "
                   "trajectory is collected once, when its agent finishes; drop "
                   "--partial-rollout"),
    Rule("v2_only_flags", lambda c: c.session_version == "v1" and _v2_only(c) is not None,
         lambda c: f"{_v2_only(c)} is a v2 option; add --session-version v2 or drop it"),
    Rule("v1_only_flags", lambda c: c.session_version == "v2" and c.max_rollback is not None,
         lambda c: "--max-rollback is a v1 option: v2 sessions never roll back (every retry "
                   "becomes a branch of the tree); drop --max-rollback"),
    Rule("max_rollback", lambda c: c.max_rollback is not None and c.max_rollback < 0,
         lambda c: "--max-rollback must be >= 0"),
    Rule("max_nodes", lambda c: c.max_nodes is not None and c.max_nodes < 1,
         lambda c: "--max-nodes must be at least 1"),
    Rule("custom_template", lambda c: c.chat_template is not None and c.family != "default",
         lambda c: f"--chat-template is only allowed with --family default (--family "
                   f"{c.family} brings its own verified template); drop one of them"),
    Rule("custom_stop_token", lambda c: c.stop_token is not None and c.family != "default",
         lambda c: f"--stop-token is only allowed with --family default (--family "
                   f"{c.family} declares its own stop tokens); drop one of them"),
    Rule("engine", lambda c: c.engine not in ENGINES,
         lambda c: f"unknown engine {c.engine!r}; use one of {', '.join(ENGINES)}"),
    Rule("engine_url_needed", lambda c: c.engine in REMOTE_ENGINES and not c.engine_url,
         lambda c: f"--engine {c.engine} needs --engine-url"),
    Rule("engine_url_unused", lambda c: c.engine not in REMOTE_ENGINES and bool(c.engine_url),
         lambda c: "--engine-url is only used with --engine sglang or vllm"),
    Rule("engine_url_kind", lambda c: any(kind not in REMOTE_ENGINES
                                          for kind, _ in engine_targets(c)),
         lambda c: "an --engine-url prefix names an engine kind: sglang+URL or vllm+URL"),
    Rule("engine_urls_unique", lambda c: len({u for _, u in engine_targets(c)})
         < len(engine_targets(c)),
         lambda c: "--engine-url names the same engine twice; give each engine once"),
    Rule("workers", lambda c: not 1 <= c.workers <= MAX_WORKERS
         or not 0 <= c.worker_index < c.workers,
         lambda c: f"--workers must be in [1, {MAX_WORKERS}]"),
    Rule("workers_port", lambda c: c.workers > 1 and c.port == 0,
         lambda c: "--workers N listens on N consecutive ports from --port: give a --port "
                   "(not 0)"),
    Rule("workers_engine", lambda c: c.workers > 1 and c.engine == "embedded",
         lambda c: "--workers runs one gateway per process and the embedded engine would "
                   "load its model in each; serve an engine (--engine sglang --engine-url "
                   "URL) behind the workers"),
    Rule("engine_max_inflight", lambda c: c.engine_max_inflight is not None
         and c.engine_max_inflight < 1,
         lambda c: "--engine-max-inflight must be at least 1"),
    Rule("tokenizer_needed", lambda c: c.engine in (*REMOTE_ENGINES, "mock")
         and not c.tokenizer,
         lambda c: f"--tokenizer is required with --engine {c.engine}"),
    Rule("tokenizer_unused", lambda c: c.engine == "embedded" and bool(c.tokenizer),
         lambda c: "--tokenizer is not used with --engine embedded (the embedded model "
                   "brings its own tokenizer)"),
    Rule("allowed_origins", lambda c: bad_origin(c.allowed_origins) is not None,
         lambda c: f"--allowed-origins {bad_origin(c.allowed_origins)!r} is not an origin; "
                   "give scheme://host[:port] (http or https) or '*'"),
    Rule("pause_mode", lambda c: c.pause_generation_mode not in PAUSE_MODES,
         lambda c: f"--pause-generation-mode {c.pause_generation_mode!r} is not a pause mode; "
                   f"use one of {', '.join(PAUSE_MODES)}"),
    Rule("weight_versions_format",
         lambda c: c.weight_versions_format not in ("versions", "spans"),
         lambda c: f"--weight-versions-format {c.weight_versions_format!r} is not a choice; "
                   "use versions or spans"),
    Rule("compat", lambda c: c.compat not in COMPAT,
         lambda c: f"--compat {c.compat!r} is not a choice; use one of {', '.join(COMPAT)}"),
    Rule("hosted_tools", lambda c: c.hosted_tools not in HOSTED_TOOLS,
         lambda c: f"--hosted-tools {c.hosted_tools!r} is not a choice; use one of "
                   f"{', '.join(HOSTED_TOOLS)}"),
    Rule("images", lambda c: c.images not in IMAGES,
         lambda c: f"--images {c.images!r} is not a choice; use one of {', '.join(IMAGES)}"),
    Rule("side_requests", lambda c: c.side_requests not in SIDE_REQUESTS,
         lambda c: f"--side-requests {c.side_requests!r} is not a choice; use one of "
                   f"{', '.join(SIDE_REQUESTS)}"),
    Rule("after_length_cut", lambda c: c.after_length_cut not in AFTER_LENGTH_CUT,
         lambda c: f"--after-length-cut {c.after_length_cut!r} is not a choice; use one of "
                   f"{', '.join(AFTER_LENGTH_CUT)}"),
    Rule("routing_replay_engine", lambda c: c.routing_replay and c.engine == "embedded",
         lambda c: "--routing-replay needs an MoE engine that reports routed experts "
                   "(--engine sglang, or the mock with --enable-return-routed-experts); the "
                   "embedded model is dense"),
    Rule("indexer_replay_engine", lambda c: c.indexer_replay and c.engine == "embedded",
         lambda c: "--indexer-replay needs an engine that reports indexer top-k (--engine "
                   "sglang, or the mock with --enable-return-indexer-topk); the embedded "
                   "model has no sparse-attention indexer"),
    Rule("sampling_mask_engine", lambda c: c.sampling_mask_replay
         and c.engine in ("embedded", "vllm"),
         lambda c: f"--sampling-mask-replay needs an engine that returns the kept token set "
                   f"of every generated position (--engine sglang with return_sampling_mask, "
                   f"or the mock); {_no_mask_reason(c.engine)}"),
    Rule("routing_layers_unused", lambda c: c.routing_layers is not None
         and not c.routing_replay,
         lambda c: "--routing-layers is only used with --routing-replay; add it or drop "
                   "--routing-layers"),
    Rule("routing_layers", lambda c: c.routing_layers is not None and c.routing_layers < 1,
         lambda c: "--routing-layers must be at least 1"),
    Rule("lora_engine", lambda c: c.lora_name is not None and c.engine == "embedded",
         lambda c: "--lora-name needs an engine that serves LoRA adapters (--engine sglang); "
                   "the embedded engine has none"),
    Rule("max_seq_len", lambda c: c.max_seq_len is not None and c.max_seq_len < 2,
         lambda c: "--max-seq-len must be at least 2"),
    Rule("max_prompt_tokens", lambda c: c.max_prompt_tokens is not None
         and c.max_prompt_tokens < 1,
         lambda c: "--max-prompt-tokens must be at least 1"),
    Rule("max_json_depth", lambda c: not 4 <= c.max_json_depth <= 512,
         lambda c: "--max-json-depth must be in [4, 512]"),
    Rule("default_max_tokens", lambda c: c.default_max_tokens < 1,
         lambda c: "--default-max-tokens must be at least 1"),
    Rule("stream_interval", lambda c: c.stream_interval < 1,
         lambda c: "--stream-interval must be at least 1"),
    Rule("keepalive_timeout", lambda c: not c.keepalive_timeout > 0,
         lambda c: "--keepalive-timeout must be above 0"),
    Rule("routing_replay_retract", lambda c: c.replay
         and c.pause_generation_mode == "retract",
         lambda c: f"{_replay_flags(c)} with --pause-generation-mode retract requests the "
                   "rows of the whole prompt every turn (retract may recompute earlier "
                   "rows): payloads and stored bytes grow with every turn; use "
                   "--pause-generation-mode in_place or abort for incremental rows",
         level="warning"),
)


def engine_targets(config: ServerConfig) -> list[tuple[str, str]]:
    """(kind, URL) of every ``--engine-url``: ``vllm+http://...`` names its kind, a plain
    URL is of ``--engine``'s kind (engines of both kinds may serve side by side)."""
    out = []
    for raw in (config.engine_url, *config.extra_engine_urls):
        if not raw:
            continue
        kind, sep, url = raw.partition("+")
        out.append((kind, url) if sep and "://" in url else (config.engine, raw))
    return out


def check(config: ServerConfig) -> list[str]:
    """Raise :class:`ConfigError` on the first broken error rule; log and return the
    messages of the broken warning rules."""
    warnings: list[str] = []
    for rule in RULES:
        if not rule.broken(config):
            continue
        if rule.level == "error":
            raise ConfigError(rule.message(config))
        warnings.append(rule.message(config))
        log.warning("%s", rule.message(config))
    return warnings
