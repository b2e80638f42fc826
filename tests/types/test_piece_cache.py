"""The fast encoder's memory of long pieces (:mod:`tito.types.piece_cache`) gives exactly
what encoding again gives: a harness's first turns (a long system prompt and tool list,
the same in every session, around a message of its own) encode as the original tokenizer
does on the first sighting, the second (admitted) and every later one (from the cache);
pieces seen once are never kept; the kept characters stay under their bound, least
recently used first out; callers get lists of their own."""

from __future__ import annotations

import threading

import pytest
import tokenizers
from helpers.support import tokenizer_dir

from tito.types.fast_bpe import fast_codec
from tito.types.piece_cache import LONG_PIECE, RepeatedPieces

WORDS = "the quick brown fox jumps over the lazy dog 123 café 中文 😀\n\n  ".split(" ")


def long_text(seed: int, chars: int = 3 * LONG_PIECE) -> str:
    out, i = [], seed
    while sum(map(len, out)) < chars:
        out.append(WORDS[i % len(WORDS)])
        i = i * 7 + 3
    return " ".join(out)


class Counted:
    """An encoder that counts its calls (the cache's ``encode``)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str) -> list[int]:
        self.calls += 1
        return [ord(c) for c in text]


def test_a_piece_is_kept_once_seen_twice_and_given_as_a_new_list() -> None:
    enc = Counted()
    cache = RepeatedPieces(enc)
    piece = long_text(1)
    expected = enc(piece)
    enc.calls = 0
    first, second = cache(piece), cache(piece)
    assert first == second == expected and enc.calls == 2 and len(cache) == 1
    third = cache(piece)
    assert third == expected and enc.calls == 2  # from the cache
    third.append(-1)  # the caller's own list: the cache is untouched
    assert cache(piece) == expected and enc.calls == 2


def test_pieces_seen_once_are_never_kept() -> None:
    enc = Counted()
    cache = RepeatedPieces(enc, seen_kept=4)
    for seed in range(20):
        assert cache(long_text(seed)) == enc(long_text(seed))
    assert len(cache) == 0


def test_kept_characters_stay_bounded_least_recently_used_out() -> None:
    enc = Counted()
    pieces = [long_text(seed, 1000) for seed in range(4)]
    cache = RepeatedPieces(enc, kept_chars=3 * max(map(len, pieces)))
    for piece in pieces[:3]:
        cache(piece), cache(piece)
    assert len(cache) == 3
    cache(pieces[0])  # now the most recently used: pieces[1] is the oldest
    cache(pieces[3]), cache(pieces[3])
    assert len(cache) == 3
    calls = enc.calls
    for piece in (pieces[0], pieces[2], pieces[3]):
        assert cache(piece) == [ord(c) for c in piece]
    assert enc.calls == calls
    assert cache(pieces[1]) == [ord(c) for c in pieces[1]] and enc.calls == calls + 1


def test_concurrent_callers_get_exact_encodings() -> None:
    enc = Counted()
    cache = RepeatedPieces(enc, kept_chars=4 * LONG_PIECE * 3)
    pieces = [long_text(seed) for seed in range(8)]
    wrong: list[int] = []

    def work(k: int) -> None:
        for i in range(200):
            piece = pieces[(i * (k + 1)) % len(pieces)]
            if cache(piece) != [ord(c) for c in piece]:
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


@pytest.mark.slow  # building the fast codec: ~1-2 s of CPU
@pytest.mark.parametrize("name", ["qwen3"])
def test_harness_first_turns_encode_as_the_original(name: str) -> None:
    """Every session's first prompt holds the same long system piece: sighting one, two
    (admitted) and three (from the cache) give the original tokenizer's ids."""
    backend = tokenizers.Tokenizer.from_file(str(tokenizer_dir(name) / "tokenizer.json"))
    fast = fast_codec(backend)
    assert fast is not None
    system = "You are a coding agent.\n" + long_text(5, 20 * LONG_PIECE)
    for session in range(4):
        text = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
                f"{long_text(100 + session)}<|im_end|>\n<|im_start|>assistant\n")
        assert fast.encode(text) == backend.encode(text, add_special_tokens=False).ids
        alone = system + f" {session}"  # no added token: the piece is the whole text
        assert fast.encode(alone) == backend.encode(alone, add_special_tokens=False).ids
