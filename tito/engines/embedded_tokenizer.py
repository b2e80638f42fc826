"""The embedded model's tokenizer, rebuilt from the GGUF metadata (no ``transformers``).

``transformers``' GGUF tokenizer conversion does not special-case llama.cpp's ``smollm``
pre-tokenizer, so digit runs tokenize differently from the model's own tokenizer (about 1%
of strings). We build the byte-level BPE ourselves from ``tokenizer.ggml.tokens`` /
``tokenizer.ggml.merges`` with an individual-digits split before the GPT-2 byte-level
regex, register the control tokens (``token_type == 3``, ids 0..16) as special, and take the
chat template and the bos/eos ids from the same metadata. Rendering and the engine share
this one tokenizer, so every trajectory is self-consistent.

The result is cached as ``tokenizer.json`` + ``tokenizer_meta.json`` (reading the GGUF
metadata with the ``gguf`` package takes ~2 s; the cached copy loads in milliseconds).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from tito.engines.embedded_files import cache_dir, find_gguf, read_cached, write_cached
from tito.types.errors import EngineError
from tito.types.tokenizer import Tokenizer

CONTROL_TOKEN_TYPE = 3
TOKENIZER_NAME = "smollm2"

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class TokenizerMeta:
    """What the GGUF says about special tokens and the chat template."""

    bos_token_id: int | None
    eos_token_id: int
    chat_template: str | None
    special_tokens: tuple[str, ...]


def _field(reader: Any, key: str) -> Any:
    """A metadata value of a ``GGUFReader`` (an untyped package); None when absent."""
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _list_field(reader: Any, key: str, item: type[_T], *, required: bool = True) -> list[_T]:
    """A metadata array whose items are all ``item`` (``[]`` when optional and absent)."""
    value = _field(reader, key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(v, item) for v in value):
        raise EngineError(f"embedded model metadata: {key} is not a list of {item.__name__}")
    return value


def _int_field(reader: Any, key: str) -> int | None:
    value = _field(reader, key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise EngineError(f"embedded model metadata: {key} is not an integer: {value!r}")
    return int(value)


def _merge_pair(merge: str) -> tuple[str, str]:
    left, sep, right = merge.partition(" ")
    if not sep:
        raise EngineError(f"embedded model metadata: malformed BPE merge {merge!r}")
    return left, right


def _from_gguf(gguf: Path) -> tuple[tokenizers.Tokenizer, TokenizerMeta]:
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise EngineError("reading the embedded model needs the 'gguf' package") from exc
    reader = GGUFReader(str(gguf))
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise EngineError(f"embedded tokenizer: expected a gpt2 BPE vocabulary, got {model!r}")
    tokens = _list_field(reader, "tokenizer.ggml.tokens", str)
    merges = [_merge_pair(m) for m in _list_field(reader, "tokenizer.ggml.merges", str)]
    types = _list_field(reader, "tokenizer.ggml.token_type", int, required=False)
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    backend = tokenizers.Tokenizer(bpe)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    special = tuple(t for t, ty in zip(tokens, types, strict=False) if ty == CONTROL_TOKEN_TYPE)
    backend.add_special_tokens(
        [tokenizers.AddedToken(t, special=True, normalized=False) for t in special]
    )
    eos = _int_field(reader, "tokenizer.ggml.eos_token_id")
    if eos is None:
        raise EngineError("embedded model metadata has no tokenizer.ggml.eos_token_id")
    template = _field(reader, "tokenizer.chat_template")
    meta = TokenizerMeta(
        bos_token_id=_int_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=eos,
        chat_template=template if isinstance(template, str) else None,
        special_tokens=special,
    )
    return backend, meta


def load_tokenizer_parts(
    gguf_path: str | os.PathLike[str] | None = None, *, cache_root: Path | None = None
) -> tuple[tokenizers.Tokenizer, TokenizerMeta]:
    """The ``tokenizers`` backend and metadata, from the cache or (first time) the GGUF."""
    gguf = find_gguf(gguf_path)
    folder = cache_dir(gguf, "tokenizer", cache_root)
    if read_cached(folder) is not None:
        try:
            backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
            raw = json.loads((folder / "tokenizer_meta.json").read_text())
            raw["special_tokens"] = tuple(raw["special_tokens"])
            return backend, TokenizerMeta(**raw)
        except Exception:
            pass  # a damaged cache: rebuild it below
    backend, meta = _from_gguf(gguf)

    def write(tmp: Path) -> None:
        backend.save(str(tmp / "tokenizer.json"))
        raw = {f: getattr(meta, f) for f in meta.__dataclass_fields__}
        raw["special_tokens"] = list(meta.special_tokens)
        (tmp / "tokenizer_meta.json").write_text(json.dumps(raw, indent=1))

    write_cached(folder, write, {"source": str(gguf)})
    return backend, meta


def make_tokenizer(backend: tokenizers.Tokenizer, meta: TokenizerMeta) -> Tokenizer:
    """Wrap a backend and its metadata as the renderer's :class:`Tokenizer`."""
    eos = backend.id_to_token(meta.eos_token_id)
    return Tokenizer.from_backend(
        backend, chat_template=meta.chat_template, eos_token=eos, name=TOKENIZER_NAME
    )


def load_embedded_tokenizer(
    gguf_path: str | os.PathLike[str] | None = None, *, cache_root: Path | None = None
) -> Tokenizer:
    """Our tokenizer for the embedded model (SmolLM2), with its chat template and eos."""
    return make_tokenizer(*load_tokenizer_parts(gguf_path, cache_root=cache_root))
