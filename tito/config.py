"""Gateway configuration (one dataclass; the CLI fills it, tests build it directly).

:meth:`ServerConfig.validate` checks flag combinations before anything starts and raises
:class:`tito.types.errors.ConfigError` (the CLI's exit status 2), never an HTTP error.
"""

from __future__ import annotations

from dataclasses import dataclass

from tito.types.errors import ConfigError

SESSION_VERSIONS = ("v1", "v2")
ENGINES = ("embedded", "sglang", "mock")
"""embedded: SmolLM2 in this process; sglang: a server at ``engine_url``; mock: a
``tito mock-engine`` child process started by the stack (``tito rollout``, the demo)."""


@dataclass
class ServerConfig:
    tokenizer: str
    family: str = "default"
    engine: str = "sglang"
    engine_url: str | None = None
    chat_template: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    message_matcher: str = "strict"
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
    served_model_name: str | None = None
    strict_template: bool = False
    journal: str | None = None
    """Folder of the write-ahead journal that makes sessions survive a crash."""
    api_key: str | None = None
    """Required as ``Authorization: Bearer KEY`` on every route but ``/health``."""
    allowed_hosts: tuple[str, ...] | None = None
    """``Host`` names served (``*``: any); None: loopback names and ``host``."""
    access_log: bool = False
    """One log line per HTTP request (uvicorn's access log)."""
    log_level: str = "info"

    def validate(self) -> None:
        """Raise :class:`ConfigError` on the first bad flag or flag combination."""
        self._validate_sessions()
        if self.chat_template is not None and self.family != "default":
            raise ConfigError("--chat-template is only allowed with --family default")
        self._validate_engine()
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ConfigError("--max-seq-len must be at least 2")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ConfigError("--max-prompt-tokens must be at least 1")
        if not 4 <= self.max_json_depth <= 512:
            raise ConfigError("--max-json-depth must be in [4, 512]")
        if self.default_max_tokens < 1:
            raise ConfigError("--default-max-tokens must be at least 1")

    def _validate_sessions(self) -> None:
        if self.session_version not in SESSION_VERSIONS:
            raise ConfigError(f"--session-version {self.session_version!r} is not a session "
                              "version; use v1 (linear) or v2 (tree)")
        if self.session_version == "v1":
            v2_only = {"--max-nodes": self.max_nodes, "--sample-picker": self.sample_picker,
                       "--sample-postprocessor": self.sample_postprocessor}
            for flag, value in v2_only.items():
                if value is not None:
                    raise ConfigError(f"{flag} is a v2 option; add --session-version v2")
        elif self.max_rollback is not None:
            raise ConfigError("--max-rollback is a v1 option: v2 sessions never roll back "
                              "(every retry becomes a branch of the tree)")
        if self.max_rollback is not None and self.max_rollback < 0:
            raise ConfigError("--max-rollback must be >= 0")
        if self.max_nodes is not None and self.max_nodes < 1:
            raise ConfigError("--max-nodes must be at least 1")

    def _validate_engine(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}; use one of {', '.join(ENGINES)}")
        if self.engine == "sglang" and not self.engine_url:
            raise ConfigError("--engine sglang needs --engine-url")
        if self.engine != "sglang" and self.engine_url:
            raise ConfigError("--engine-url is only used with --engine sglang")
        if self.engine in ("sglang", "mock") and not self.tokenizer:
            raise ConfigError(f"--tokenizer is required with --engine {self.engine}")
        if self.engine == "embedded" and self.tokenizer:
            raise ConfigError("--tokenizer is not used with --engine embedded (the embedded "
                              "model brings its own tokenizer)")
