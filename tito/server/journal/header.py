"""What a journal must be replayed under: its header frame records the session version,
the family, fingerprints of the chat template and the tokenizer, and the worker layout;
a gateway whose configuration differs refuses to start, naming the flag (its stored ids
would be replayed under another template, or its sessions sought by the wrong worker).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from tito.config import ServerConfig
from tito.render.base import TemplateRenderer
from tito.server.journal.frames import FILE
from tito.types.errors import ConfigError

FORMAT = 2
FIELDS = (("session_version", "--session-version"), ("family", "--family"),
          ("template", "--chat-template (or the tokenizer's own chat template)"),
          ("tokenizer", "--tokenizer"), ("workers", "--workers"))
"""The header fields that must match, and the flag each comes from."""


def fingerprint(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def tokenizer_fingerprint(renderer: TemplateRenderer) -> str:
    """The tokenizer's vocabulary and rules (its ``tokenizer.json``, or the backend's)."""
    tokenizer = renderer.tokenizer
    source = getattr(tokenizer, "source", None)
    if source is not None and Path(source).is_file():
        return fingerprint(Path(source).read_bytes())
    return fingerprint(tokenizer.backend.to_str())


def expected(config: ServerConfig, renderer: TemplateRenderer) -> dict[str, Any]:
    """This gateway's header."""
    return {"op": "header", "format": FORMAT, "created": time.time(),
            "session_version": config.session_version, "family": renderer.family,
            "template": fingerprint(renderer.template),
            "tokenizer": tokenizer_fingerprint(renderer), "workers": config.workers,
            "worker": config.worker_index if config.workers > 1 else None}


def check(found: dict[str, Any], wanted: dict[str, Any], path: Path) -> None:
    """ConfigError naming every flag whose value differs from the journal's."""
    wrong = [f"{flag}: the journal has {found[name]!r}, this gateway {wanted[name]!r}"
             for name, flag in FIELDS
             if found.get(name) is not None and found[name] != wanted[name]]
    if wrong:
        raise ConfigError(
            f"--journal {str(path)!r} was written under another configuration, and its "
            f"sessions cannot be replayed under this one ({'; '.join(wrong)}). Start with "
            "the journal's settings, or with another --journal folder")


def check_layout(root: Path, workers: int) -> None:
    """A journal folder written under another ``--workers`` is refused: one worker
    journals to ``root/journal.bin``, several to ``root/worker-i/``."""
    single = (root / FILE).exists() and (root / FILE).stat().st_size > 0
    folders = sorted(p.name for p in root.glob("worker-*") if (p / FILE).exists())
    if workers == 1 and folders:
        raise ConfigError(f"--journal {str(root)!r} holds the journals of several workers "
                          f"({', '.join(folders)}): start with --workers {len(folders)}")
    if workers > 1 and single:
        raise ConfigError(f"--journal {str(root)!r} holds the journal of a single gateway "
                          f"({FILE}): start with --workers 1")
    extra = [name for name in folders if int(name.split("-")[1]) >= workers]
    if workers > 1 and extra:
        raise ConfigError(f"--journal {str(root)!r} holds the journals of more workers "
                          f"({', '.join(folders)}): start with --workers {len(folders)}")
