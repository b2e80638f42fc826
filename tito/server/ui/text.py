"""Per-token text of a trajectory, as an incremental detokenizer shows it (pure).

Decoding each id on its own is right for most tokens, but not for a character whose
UTF-8 bytes are split over several tokens (each piece decodes to U+FFFD) nor for
tokenizers whose decoder strips a word's leading space at the start of a text. Ids are
decoded in chunks; a chunk whose single-token texts do not add up to its own decode is
decoded incrementally instead: each token's text is what it adds to the decode of the
few tokens before it, and the pieces of a split character give the character to the token
that completes it (a piece with nothing else shows as empty).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tito.types.tokenizer import Tokenizer

DecodeBatch = Callable[[list[list[int]]], list[str]]
"""Decode many id lists at once (special tokens kept)."""
REPLACEMENT = "\ufffd"
CHUNK = 256
CONTEXT = 4
"""Tokens decoded before a token to read what it adds (a UTF-8 character has <= 4 bytes)."""


def decoder_of(tokenizer: Tokenizer) -> DecodeBatch:
    backend = tokenizer.backend
    return lambda batch: list(backend.decode_batch(batch, skip_special_tokens=False))


def token_texts(ids: Sequence[int], decode_batch: DecodeBatch) -> list[str]:
    """The text each of ``ids`` adds to the decoded trajectory (``"".join`` of the result
    equals the decode of all ids, except where the ids are not valid UTF-8)."""
    ids = [int(i) for i in ids]
    if not ids:
        return []
    texts = decode_batch([[i] for i in ids])
    starts = range(0, len(ids), CHUNK)
    wholes = decode_batch([ids[s : s + CHUNK] for s in starts])
    redo = [p for s, whole in zip(starts, wholes, strict=True)
            if REPLACEMENT in whole or "".join(texts[s : s + CHUNK]) != whole
            for p in range(s, min(s + CHUNK, len(ids)))]
    if redo:
        for p, text in zip(redo, _incremental(ids, redo, decode_batch), strict=True):
            texts[p] = text
    return texts


def _incremental(ids: list[int], positions: list[int], decode_batch: DecodeBatch
                 ) -> list[str]:
    fulls = decode_batch([ids[max(0, p - CONTEXT) : p + 1] for p in positions])
    prevs = decode_batch([ids[max(0, p - CONTEXT) : p] for p in positions])
    out: list[str] = []
    for p, full, prev in zip(positions, fulls, prevs, strict=True):
        base = prev.rstrip(REPLACEMENT)  # a character cut at its end is not shown yet
        text = full[len(base):] if full.startswith(base) else decode_batch([[ids[p]]])[0]
        # the start of a character a later token completes: that token shows it
        out.append(text.rstrip(REPLACEMENT) if p + 1 < len(ids) else text)
    return out
