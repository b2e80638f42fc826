r"""A faster encoder for byte-level BPE tokenizers whose pre-tokenizer is one regex.

On the gateway's hot path, tokenizing a turn's appended messages is the largest single
cost, and most of it is the ``tokenizers`` library's regex pre-tokenizer (Oniguruma),
several times slower than ``tiktoken`` (a Rust regex and the same byte-level BPE; figures
in docs/performance.md, "Figures behind the code"). :func:`fast_encoder` builds a ``tiktoken``
encoding from a ``tokenizers`` byte-level BPE when the model has that shape (vocabulary
ranks equal to ids and in merge order, a single ``Split`` regex or GPT-2's, NFC or no
normalizer, added tokens matched verbatim) and checks it equivalent before it is used: it
must give the same ids as the original on a fixed corpus (scripts, digits, whitespace
runs, case-folded contractions, combining marks, emoji, every added token). Anything
else — another model shape, ``tiktoken`` missing, one differing id — returns None and the
original encoder is kept. Added tokens are matched by :func:`added_token_splitter` (a trie
regex, leftmost-longest as ``tokenizers`` does) and the text between them is encoded as
ordinary text: ``tiktoken``'s own ``allowed_special`` costs time per added token on
every call, which dominates for a model with hundreds of added tokens.

Most of ``tiktoken``'s time goes to its regex, which runs on the slower backtracking
engine because of one lookahead, ``\s+(?!\S)`` (a run of whitespace keeps its last
character for the next piece). That alternative can only match differently from the
``\s+`` after it on a run of two or more whitespace characters: an ASCII piece of text
without one is encoded by a second encoding whose pattern leaves it out (about twice as
fast on plain prose). The check (:func:`_plain`) is cheap next to what it saves; texts that
fail it keep the full pattern.

Decoding (parsing every completion) goes the same way when the decoder is ``ByteLevel``:
the tokens' bytes from ``tiktoken``, then UTF-8 with replacement characters, checked
against the original on the corpus' ids and on random id runs that split UTF-8
sequences; a few times faster than the original decoder.
"""

from __future__ import annotations

import logging
import random
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import filterfalse
from typing import Any

import orjson

from tito.types.piece_cache import LONG_PIECE, RepeatedPieces

log = logging.getLogger("tito.tokenizer")

Encode = Callable[[str], list[int]]
Decode = Callable[[Sequence[int], bool], str]
"""(ids, skip_special_tokens) -> text."""

GPT2_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
_NORMALIZERS = (None, "NFC")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable-character alphabet: the character that stands for each byte in a
    byte-level BPE vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _byte_decoder() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def _pattern(pre: dict[str, Any]) -> str | None:
    """The pre-tokenizer's regex, when it is one Split (+ ByteLevel without regex) or a
    ByteLevel with GPT-2's regex."""
    if pre.get("type") == "ByteLevel":
        return GPT2_PATTERN if pre.get("use_regex", True) and not pre.get(
            "add_prefix_space") else None
    if pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or \
            split.get("invert") or byte_level.get("type") != "ByteLevel" or \
            byte_level.get("use_regex") or byte_level.get("add_prefix_space"):
        return None
    regex = (split.get("pattern") or {}).get("Regex")
    return regex if isinstance(regex, str) else None


def _normalizer(norm: dict[str, Any] | None) -> str | bool | None:
    """None (no normalizer), ``"NFC"``, or False: a normalizer we do not reproduce."""
    if norm is None:
        return None
    if norm.get("type") == "NFC":
        return "NFC"
    if norm.get("type") == "Sequence" and [n.get("type") for n in norm.get(
            "normalizers", [])] == ["NFC"]:
        return "NFC"
    return False


def _state(component: Any) -> dict[str, Any] | None:
    return None if component is None else orjson.loads(component.__getstate__())


def _ranks(backend: Any, source: bytes | None) -> dict[bytes, int] | None:
    """Byte sequence -> id of a byte-level BPE vocabulary (None: not one). ``source``: the
    ``tokenizer.json`` the backend was loaded from (parsing it is faster than asking the
    backend for its vocabulary and merges)."""
    model = backend.model
    if type(model).__name__ != "BPE" or model.dropout or model.continuing_subword_prefix \
            or model.end_of_word_suffix or model.byte_fallback:
        return None
    state = (orjson.loads(source).get("model") if source is not None else None) or \
        orjson.loads(model.__getstate__())
    added = set(backend.get_added_tokens_decoder())
    vocab: dict[str, int] = {token: idx for token, idx in state.get("vocab", {}).items()
                             if idx not in added}
    decoder = _byte_decoder()
    if not vocab or not set("".join(vocab)) <= decoder.keys():  # outside the byte alphabet
        return None
    if not _merges_follow_ranks(state.get("merges") or [], vocab):
        return None
    table = str.maketrans({c: chr(b) for c, b in decoder.items()})
    return {token.translate(table).encode("latin-1"): idx for token, idx in vocab.items()}


def _merges_follow_ranks(merges: list[Any], vocab: dict[str, int]) -> bool:
    """Whether the id of the token merge ``i`` creates never decreases with ``i``: then
    "merge the pair whose result has the lowest id" (tiktoken) and "apply the earliest
    merge rule" (``tokenizers``) pick the same pair at every step (the corpus check covers
    the rest)."""
    last = -1
    for merge in merges:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        idx = vocab.get(left + right)
        if idx is None or idx < last:
            return False
        last = idx
    return True


def _corpus(added: list[str]) -> list[str]:
    """Texts the fast encoder must agree on before it is trusted."""
    rng = random.Random(0)
    pieces = ["Hello", "world", "  ", "\n", "\n\n", "\r\n", "\t", " ", "   x", "123",
              "4567890", "3.14", "'s", "'S", "'ll", "'LL", "'re", "'ve", "'m", "'d", "'t",
              "can't", "中文", "你好，世界。", "日本語", "한국어", "Ünïcödé", "cafe\u0301",
              "e\u0301", "Ω", "😀", "👍🏽", "🇫🇷", "def f(x):", "    return", "{\"a\": 1}",
              "</tool_response>", "<tool_call>", "x**2", "\u00a0", "\u3000", "—", "...",
              "ﬁ", "Ⅻ", "½", "\u200b", "A" * 30, "a" * 200, ".", "!!", "??", "$$"]
    texts = [*pieces, *added]
    for _ in range(400):
        n = rng.randint(1, 12)
        texts.append("".join(rng.choice(pieces + added) if rng.random() < 0.2
                             else rng.choice(pieces) for _ in range(n)))
    return texts


@dataclass(frozen=True)
class FastCodec:
    """``encode`` is equivalent to the original's; ``decode`` (None: keep the original's)
    too, on the check corpus."""

    encode: Encode
    decode: Decode | None
    encoding: Any = None
    """The ``tiktoken.Encoding`` under both."""


def added_token_splitter(added: Iterable[str]) -> Callable[[str], list[str]]:
    """``split(text)``: ``text`` cut around every added token, leftmost and longest first
    (as ``tokenizers`` matches them): ``[text, token, text, token, ..., text]``.

    The added tokens are matched here rather than by ``tiktoken``'s ``allowed_special``,
    which converts the allowed set to a Rust hash set on every call (a cost per added
    token, per call). The pattern is a trie of the tokens, so a
    position that starts none of them costs one character test."""
    trie: dict[str, Any] = {}
    for token in added:
        node = trie
        for ch in token:
            node = node.setdefault(ch, {})
        node[""] = {}  # a token ends here

    def pattern(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + pattern(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if "" in node:  # a token ends here and longer ones go on: the longer first (greedy)
            return "(?:" + body + ")?"
        return body

    if not trie:
        return lambda text: [text]
    return re.compile("(" + pattern(trie) + ")").split


def fast_codec(backend: Any, source: bytes | None = None) -> FastCodec | None:
    """A ``tiktoken`` encoder (and decoder) equivalent to ``backend`` (a
    ``tokenizers.Tokenizer``, loaded from the ``tokenizer.json`` bytes ``source`` when
    known) on every text of the check corpus; None when it cannot be built or is not
    equivalent."""
    try:
        import tiktoken
    except ImportError:
        return None
    try:
        pattern = _pattern(_state(backend.pre_tokenizer) or {})
        normalizer = _normalizer(_state(backend.normalizer))
        decoder = _state(backend.decoder) or {}
    except Exception:  # a component without a serializable state: keep the original
        return None
    tokens = backend.get_added_tokens_decoder()
    if pattern is None or normalizer is False or any(
            t.normalized or t.lstrip or t.rstrip or t.single_word for t in tokens.values()):
        return None
    added = {t.content: idx for idx, t in tokens.items()}
    ranks = _ranks(backend, source)
    if ranks is None:
        return None
    try:
        encoding = tiktoken.Encoding(f"tito-{id(backend)}", pat_str=pattern,
                                     mergeable_ranks=ranks, special_tokens=added)
    except Exception as exc:  # a vocabulary tiktoken does not accept
        log.debug("no fast encoder: %s", exc)
        return None
    plain = _plain_encoding(tiktoken, encoding, pattern, ranks, added)
    encode = _encoder(encoding, added, nfc=normalizer == "NFC", plain=plain)

    corpus = _corpus(list(added))
    for text in corpus:
        if encode(text) != backend.encode(text, add_special_tokens=False).ids:
            log.debug("no fast encoder: differs on %r", text)
            return None
    return FastCodec(encode, _checked_decoder(encoding, backend, decoder, encode, corpus),
                     encoding)


SHORT_PIECE = 24
"""Ordinary text between added tokens up to this many characters is encoded once and
kept: a chat template's scaffolding (``"\\n"``, ``"user\\n"``, ``"assistant\\n"``) recurs in
every turn, and each ``tiktoken`` call has a fixed cost whatever its length."""
SHORT_PIECES_KEPT = 4096


LOOKAHEAD_TAIL = r"|\s+(?!\S)|\s+"
"""How the pre-tokenizer patterns of GPT-2's lineage end (cl100k, o200k, Llama 3, Qwen):
the only lookahead, then plain whitespace runs."""

_WHITESPACE_TO_NUL = bytes.maketrans(b"\t\n\x0b\x0c\r \x00", b"\x00\x00\x00\x00\x00\x00\x01")
r"""ASCII whitespace (what the Rust regex's Unicode ``\s`` matches below 128) to NUL, and
NUL itself to 1."""


def _plain(text: str) -> bool:
    r"""Whether ``text`` is ASCII with no two whitespace characters in a row: then the
    lookahead alternative of :data:`LOOKAHEAD_TAIL` matches exactly what ``\s+`` would
    (one whitespace character at the very end), or nothing (one followed by a
    non-whitespace character)."""
    return text.isascii() and b"\x00\x00" not in text.encode().translate(_WHITESPACE_TO_NUL)


def _plain_encoding(tiktoken: Any, encoding: Any, pattern: str, ranks: dict[bytes, int],
                    added: dict[str, int]) -> Any:
    """The encoding without the lookahead alternative, for :func:`_plain` texts (None
    when the pattern does not end with :data:`LOOKAHEAD_TAIL` or has another lookaround)."""
    if not pattern.endswith(LOOKAHEAD_TAIL):
        return None
    plain = pattern[: -len(LOOKAHEAD_TAIL)] + r"|\s+"
    if "(?=" in plain or "(?!" in plain or "(?<" in plain:
        return None
    try:
        return tiktoken.Encoding(f"{encoding.name}-plain", pat_str=plain,
                                 mergeable_ranks=ranks, special_tokens=added)
    except Exception as exc:  # pragma: no cover - the full pattern compiled
        log.debug("no plain-whitespace encoding: %s", exc)
        return None


def _ordinary(encoding: Any, plain: Any) -> Encode:
    """``encode_ordinary``, by ``plain`` for :func:`_plain` texts when there is one."""
    full: Encode = encoding.encode_ordinary
    if plain is None:
        return full
    fast: Encode = plain.encode_ordinary

    def ordinary(text: str) -> list[int]:
        return fast(text) if _plain(text) else full(text)

    return ordinary


def _encoder(encoding: Any, added: dict[str, int], *, nfc: bool, plain: Any = None
             ) -> Encode:
    """Added tokens matched by :func:`added_token_splitter`, the text between them encoded
    by ``tiktoken`` as ordinary text (what ``encode(allowed_special=...)`` does), by
    ``plain`` (:func:`_plain_encoding`) when the text allows (:func:`_pieces`)."""
    split = added_token_splitter(added)
    piece = _pieces(_ordinary(encoding, plain))

    def encode(text: str) -> list[int]:
        if nfc:
            text = unicodedata.normalize("NFC", text)
        parts = split(text)  # [text, added, text, added, ..., text]
        if len(parts) == 1:  # only the short pieces' table hands out kept lists
            return list(piece(text)) if len(text) <= SHORT_PIECE else piece(text)
        ids: list[int] = []
        for i, part in enumerate(parts):
            if i & 1:
                ids.append(added[part])
            elif part:
                ids += piece(part)
        return ids

    return encode


def _pieces(ordinary: Encode) -> Encode:
    """The ids of a piece of ordinary text (not to be kept or changed: callers copy them):
    short pieces from a bounded table, long ones that come back from
    :class:`~tito.types.piece_cache.RepeatedPieces`."""
    repeated = RepeatedPieces(ordinary)
    short: dict[str, list[int]] = {}

    def piece(part: str) -> list[int]:
        size = len(part)
        if size >= LONG_PIECE:
            return repeated(part)
        if size > SHORT_PIECE:
            return ordinary(part)
        known = short.get(part)
        if known is None:
            known = ordinary(part)
            if len(short) < SHORT_PIECES_KEPT:
                short[part] = known
        return known

    return piece


def _checked_decoder(encoding: Any, backend: Any, decoder: dict[str, Any], encode: Encode,
                     corpus: list[str]) -> Decode | None:
    """The fast decoder when ``backend``'s decoder is ``ByteLevel`` and it decodes alike."""
    if decoder.get("type") != "ByteLevel":
        return None
    special = frozenset(idx for idx, t in backend.get_added_tokens_decoder().items()
                        if t.special)
    decode = _decoder(encoding, backend, special)
    return decode if _decodes_alike(decode, backend, encode, corpus) else None


def _decoder(encoding: Any, backend: Any, special_ids: frozenset[int]) -> Decode:
    """Byte-level decoding: the tokens' bytes joined, then UTF-8 with U+FFFD for invalid
    sequences (as ``tokenizers``' ByteLevel decoder does); ``skip_special``: without the
    special added tokens. Ids ``tiktoken`` does not know (outside the vocabulary) are
    decoded by the original."""

    def decode(ids: Sequence[int], skip_special: bool) -> str:
        seq = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        kept = _without(seq, special_ids) if skip_special else seq
        try:
            raw = encoding.decode_bytes(kept)
        except Exception:
            return str(backend.decode(seq, skip_special_tokens=skip_special))
        return raw.decode("utf-8", errors="replace")

    return decode


def _without(seq: list[int], special_ids: frozenset[int]) -> list[int]:
    """``seq`` without the ids of ``special_ids``. A completion holds special ids at its
    end only, if anywhere (its stop token): those are cut off, and the rest kept whole
    when one C-level pass finds no special id in it (filtering calls a method per id)."""
    end = len(seq)
    while end and seq[end - 1] in special_ids:
        end -= 1
    head = seq[:end]
    if special_ids.isdisjoint(head):
        return head
    return list(filterfalse(special_ids.__contains__, seq))


def _decodes_alike(decode: Decode, backend: Any, encode: Encode, corpus: list[str]) -> bool:
    """The fast decoder gives the original's text for the corpus' ids and for random id
    runs (byte tokens that split UTF-8 sequences, added tokens), skipping special tokens
    or not."""
    rng = random.Random(1)
    size = backend.get_vocab_size(with_added_tokens=True)
    runs = [encode(text) for text in corpus]
    runs += [[rng.randrange(size) for _ in range(rng.randint(1, 8))] for _ in range(1500)]
    runs += [[idx] for idx in backend.get_added_tokens_decoder()]
    for ids in runs:
        for skip in (False, True):
            if decode(ids, skip) != backend.decode(ids, skip_special_tokens=skip):
                log.debug("no fast decoder: differs on %r (skip_special=%s)", ids, skip)
                return False
    return True
