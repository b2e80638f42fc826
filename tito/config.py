"""Gateway configuration (one dataclass; the CLI fills it, tests build it directly)."""

from __future__ import annotations

from dataclasses import dataclass


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
    max_seq_len: int | None = None
    default_max_tokens: int = 1024
    max_sessions: int = 10_000
    session_ttl: float = 3600.0
    max_body_bytes: int = 32 * 1024 * 1024
    engine_timeout: float = 600.0
    served_model_name: str | None = None
    strict_template: bool = False

    def validate(self) -> None:
        from tito.errors import BadRequest

        if self.session_version != "v1":
            raise BadRequest(
                f"--session-version {self.session_version!r} is not available yet; use v1"
            )
        if self.chat_template is not None and self.family != "default":
            raise BadRequest("--chat-template is only allowed with --family default")
        if self.engine not in ("sglang", "embedded"):
            raise BadRequest(f"unknown engine {self.engine!r}; use sglang or embedded")
        if self.engine == "sglang" and not self.engine_url:
            raise BadRequest("--engine sglang needs --engine-url")
        if self.engine == "sglang" and not self.tokenizer:
            raise BadRequest("--tokenizer is required with --engine sglang")
        if self.engine == "embedded" and self.tokenizer:
            raise BadRequest("--tokenizer is not used with --engine embedded (the embedded "
                             "model brings its own tokenizer)")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise BadRequest("--max-seq-len must be at least 2")
        if self.default_max_tokens < 1:
            raise BadRequest("--default-max-tokens must be at least 1")
