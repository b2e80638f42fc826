"""Loading a tokenizer and its chat template from a local folder, offline.

We use the ``tokenizers`` library directly (no ``transformers``): it is what HF fast
tokenizers run underneath, it loads in milliseconds and it encodes without Python
overhead on the hot path. Supported folder layouts:

- ``tokenizer.json`` (+ optional ``tokenizer_config.json``, ``chat_template.jinja``);
- ``vocab.json`` + ``merges.txt`` + ``special_tokens.json`` (a byte-level BPE rebuilt
  from GGUF metadata, e.g. SmolLM2), with individual-digit splitting as llama.cpp's
  ``smollm`` pre-tokenizer does.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from tito.types.errors import ConfigError
from tito.types.fast_bpe import Decode, Encode, fast_codec

log = logging.getLogger("tito.tokenizer")


@dataclass
class Tokenizer:
    """A thin, typed wrapper around :class:`tokenizers.Tokenizer`."""

    backend: tokenizers.Tokenizer
    chat_template: str | None = None
    eos_token: str | None = None
    name: str = ""
    special_ids: frozenset[int] = field(default_factory=frozenset)
    fast: Encode | None = field(default=None, repr=False, compare=False)
    """An equivalent, faster encoder (:mod:`tito.types.fast_bpe`), once built."""
    fast_decode: Decode | None = field(default=None, repr=False, compare=False)
    """An equivalent, faster decoder, built with :attr:`fast` (when it checks out too)."""
    source: Path | None = field(default=None, repr=False, compare=False)
    """The ``tokenizer.json`` the backend was loaded from, if any."""
    _fast_thread: threading.Thread | None = field(default=None, init=False, repr=False,
                                                  compare=False)

    def start_fast_encoder(self) -> threading.Thread | None:
        """Build the fast encoder in a background thread, once (0.3–1 s of CPU for a 150k
        vocabulary; the gateway starts it, tools that encode little do not pay it);
        :meth:`encode` uses the original until it is ready, and for good when the model has
        another shape or the equivalence check fails. ``TITO_FAST_BPE=0`` turns it off."""
        if os.environ.get("TITO_FAST_BPE", "1") == "0":
            return None
        if self._fast_thread is not None:
            return self._fast_thread

        def build() -> None:
            try:
                source = self.source.read_bytes() if self.source is not None else None
                codec = fast_codec(self.backend, source)
                if codec is not None:
                    self.fast_decode = codec.decode
                    self.fast = codec.encode
            except Exception:  # never worse than the original encoder
                log.warning("fast encoder for %r not built", self.name, exc_info=True)

        thread = threading.Thread(target=build, name="tito-fast-bpe", daemon=True)
        self._fast_thread = thread
        thread.start()
        return thread

    @classmethod
    def from_backend(
        cls, backend: tokenizers.Tokenizer, *, chat_template: str | None, eos_token: str | None,
        name: str = "",
    ) -> Tokenizer:
        special = frozenset(
            idx for idx, tok in backend.get_added_tokens_decoder().items() if tok.special
        )
        return cls(backend, chat_template, eos_token, name, special)

    @property
    def fast_state(self) -> str:
        """``ready``, ``building`` (in its background thread), ``unavailable`` (another
        model shape, or the equivalence check failed) or ``off`` (never started, or
        ``TITO_FAST_BPE=0``)."""
        if self.fast is not None:
            return "ready"
        if self._fast_thread is None:
            return "off"
        return "building" if self._fast_thread.is_alive() else "unavailable"

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token text is recognised, nothing is inserted."""
        fast = self.fast
        if fast is not None:
            return fast(text)
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        fast = self.fast_decode
        if fast is not None:
            return fast(ids, skip_special_tokens)
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, idx: int) -> str | None:
        return self.backend.id_to_token(idx)

    def require_id(self, token: str) -> int:
        idx = self.backend.token_to_id(token)
        if idx is None:
            raise ValueError(f"tokenizer {self.name!r} has no token {token!r}")
        return idx

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)


def _read_template(folder: Path, config: dict) -> str | None:
    for name in ("chat_template.jinja",):
        if (folder / name).is_file():
            return (folder / name).read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        for entry in template:
            if entry.get("name") == "default":
                return entry["template"]
        return template[0]["template"] if template else None
    return template


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _rebuild_bpe(folder: Path) -> tuple[tokenizers.Tokenizer, str | None]:
    """A byte-level BPE from ``vocab.json``/``merges.txt`` (GGUF-extracted vocabularies)."""
    bpe = models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
    tok = tokenizers.Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    eos = None
    special_file = folder / "special_tokens.json"
    if special_file.is_file():
        meta = json.loads(special_file.read_text())
        names = [t["content"] for t in meta.get("non_normal_tokens", [])]
        tok.add_special_tokens([tokenizers.AddedToken(n, special=True, normalized=False)
                                for n in names])
        eos_id = meta.get("eos_token_id")
        if eos_id is not None:
            eos = tok.id_to_token(eos_id)
    return tok, eos


SHARED_BACKENDS = 8
"""Loaded backends one process keeps for reuse (:func:`shared_backend`), least recently
used first out."""

_shared: OrderedDict[tuple[object, ...], tokenizers.Tokenizer] = OrderedDict()
_shared_lock = threading.Lock()


def shared_backend(sources: Sequence[Path], kind: str,
                   build: Callable[[], tokenizers.Tokenizer]) -> tokenizers.Tokenizer:
    """The backend ``build`` makes from the files ``sources``, built once per process while
    they are unchanged (keyed by ``kind`` and each file's path, size and mtime).

    Loading a 150k-vocabulary ``tokenizer.json`` takes 0.4–1.4 s of CPU, and a process that
    builds several renderers or stacks over one folder (through the Python API, or a test
    session: 49 loads in the fast tier's two workers) loaded it once per build. Nothing
    changes a backend after loading it; a shared one must stay so (no truncation, padding
    or added tokens)."""
    key = (kind, *((str(p.resolve()), st.st_size, st.st_mtime_ns)
                   for p in sources for st in (p.stat(),)))
    with _shared_lock:
        backend = _shared.get(key)
        if backend is not None:
            _shared.move_to_end(key)
            return backend
    backend = build()  # outside the lock: two threads may both build, one copy is kept
    with _shared_lock:
        backend = _shared.setdefault(key, backend)
        _shared.move_to_end(key)
        while len(_shared) > SHARED_BACKENDS:
            _shared.popitem(last=False)
    return backend


def load_tokenizer(path: str | Path, *, chat_template: str | Path | None = None) -> Tokenizer:
    """Load the tokenizer (and chat template) in ``path``; ``chat_template`` overrides it."""
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"tokenizer folder {str(folder)!r} does not exist")
    config: dict = {}
    if (folder / "tokenizer_config.json").is_file():
        config = json.loads((folder / "tokenizer_config.json").read_text())
    if (folder / "tokenizer.json").is_file():
        source = folder / "tokenizer.json"
        backend = shared_backend([source], "tokenizer.json",
                                 lambda: tokenizers.Tokenizer.from_file(str(source)))
        eos = _token_text(config.get("eos_token"))
    elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        backend, eos = _rebuild_bpe(folder)
    else:
        raise ConfigError(
            f"no tokenizer in {str(folder)!r}: expected tokenizer.json or vocab.json + merges.txt"
        )
    template = _read_template(folder, config)
    if chat_template is not None:
        template = Path(chat_template).read_text()
    tokenizer = Tokenizer.from_backend(backend, chat_template=template, eos_token=eos,
                                       name=folder.name)
    if (folder / "tokenizer.json").is_file():
        tokenizer.source = folder / "tokenizer.json"
    return tokenizer
