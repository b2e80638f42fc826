"""The fast encoder is used only where it gives the original tokenizer's ids: random texts
(scripts, whitespace, contractions, emoji, added tokens) on every eligible fixture, and a
tampered vocabulary that the equivalence check must refuse. The fast decoder gives the
original's text for random id runs (UTF-8 split across tokens, added tokens, ids outside
the vocabulary), skipping special tokens or not. (Slow tier: each build costs 0.3–1 s of
CPU.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from helpers.support import examples, tokenizer_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from tito.types.fast_bpe import FastCodec, added_token_splitter, fast_codec
from tito.types.tokenizer import load_tokenizer

ELIGIBLE = ["qwen3", "llama-3.1", "gpt-oss"]
_CACHE: dict[str, tuple[tokenizers.Tokenizer, FastCodec | None]] = {}


def pair(name: str) -> tuple[tokenizers.Tokenizer, FastCodec | None]:
    if name not in _CACHE:
        backend = tokenizers.Tokenizer.from_file(str(tokenizer_dir(name) / "tokenizer.json"))
        _CACHE[name] = (backend, fast_codec(backend))
    return _CACHE[name]


PIECES = st.sampled_from(["<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|start|>",
                          "<|end|>", "'S", "'ll", " \n", "\r\n", "\t", "  ", "\u00a0",
                          "e\u0301", "😀", "中文", "123", "'re", "ﬁ"])
TEXT = st.lists(st.one_of(st.text(max_size=20), PIECES), max_size=12).map("".join)


@pytest.mark.slow
@pytest.mark.parametrize("name", ELIGIBLE)
@settings(max_examples=examples(300), deadline=None)
@given(text=TEXT)
def test_fast_ids_equal_the_original(name: str, text: str) -> None:
    """300 random texts per fixture."""
    backend, fast = pair(name)
    assert fast is not None
    assert fast.encode(text) == backend.encode(text, add_special_tokens=False).ids


@pytest.mark.slow
@pytest.mark.parametrize("name", ELIGIBLE)
@settings(max_examples=examples(300), deadline=None)
@given(data=st.data())
def test_fast_text_equals_the_original(name: str, data: st.DataObject) -> None:
    """300 random id runs per fixture: any id of the vocabulary (so byte tokens that cut
    UTF-8 sequences, and added tokens), sometimes one past it."""
    backend, fast = pair(name)
    assert fast is not None and fast.decode is not None
    size = backend.get_vocab_size(with_added_tokens=True)
    ids = data.draw(st.lists(st.integers(0, size), max_size=16))
    for skip in (False, True):
        assert fast.decode(ids, skip) == backend.decode(ids, skip_special_tokens=skip)


def test_other_model_shapes_keep_the_original() -> None:
    _, fast = pair("deepseek-v3.1")  # a Sequence of several Split pre-tokenizers
    assert fast is None


@pytest.mark.slow
def test_a_vocabulary_that_differs_is_refused(tmp_path: Path) -> None:
    config = json.loads((tokenizer_dir("qwen3") / "tokenizer.json").read_text())
    config["model"]["merges"] = config["model"]["merges"][1:]  # one merge fewer
    backend = tokenizers.Tokenizer.from_str(json.dumps(config))
    assert fast_codec(backend) is None


@pytest.mark.slow
def test_the_tokenizer_switches_once_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = load_tokenizer(tokenizer_dir("qwen3"))
    assert tok.fast_state == "off"
    thread = tok.start_fast_encoder()
    assert thread is not None
    thread.join()
    assert tok.fast is not None and tok.fast_decode is not None and tok.fast_state == "ready"
    text = "<|im_start|>user\nhello there<|im_end|>\n"
    assert tok.encode(text) == tok.backend.encode(text, add_special_tokens=False).ids
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhello there\n"
    monkeypatch.setenv("TITO_FAST_BPE", "0")
    assert load_tokenizer(tokenizer_dir("qwen3")).start_fast_encoder() is None


def leftmost_longest(tokens: list[str], text: str) -> list[str]:
    """The reference: at each position, the longest token starting there, else one char."""
    parts, pos, start = [], 0, 0
    while pos < len(text):
        match = max((t for t in tokens if t and text.startswith(t, pos)), key=len,
                    default=None)
        if match is None:
            pos += 1
            continue
        parts += [text[start:pos], match]
        pos = start = pos + len(match)
    return [*parts, text[start:]]


def test_added_tokens_split_leftmost_longest() -> None:
    split = added_token_splitter(["<a>", "<a>b", "<ab", "<|x|>"])
    assert split("q<a>bc<ab<a><|x|><|x|") == ["q", "<a>b", "c", "<ab", "", "<a>", "",
                                               "<|x|>", "<|x|"]
    assert split("no tokens here") == ["no tokens here"]
    assert added_token_splitter([])("<a>") == ["<a>"]


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.text(alphabet="<>|ab", min_size=1, max_size=5), min_size=1, max_size=6),
       st.text(alphabet="<>|abc", max_size=30))
def test_added_token_splitter_matches_the_reference(tokens: list[str], text: str) -> None:
    assert added_token_splitter(tokens)(text) == leftmost_longest(tokens, text)


PLAIN_PIECES = st.sampled_from([" ", "\t", "\n", "\r", "\x0b", "\x0c", "'s", "'LL", "123",
                                 "a", "Zz", ".", "!?", "{}", "x  y", "\n\n", " \n", "é"])
PLAIN_TEXT = st.lists(st.one_of(st.text(st.characters(max_codepoint=127), max_size=12),
                                PLAIN_PIECES), max_size=12).map("".join)


_PLAIN: dict[str, Any] = {}


def plain_of(name: str) -> Any:
    """The fixture's lookahead-free encoding, built as fast_codec builds it."""
    import tiktoken

    from tito.types.fast_bpe import _plain_encoding

    if name not in _PLAIN:
        _, fast = pair(name)
        assert fast is not None
        full = fast.encoding
        _PLAIN[name] = _plain_encoding(tiktoken, full, full._pat_str,
                                       full._mergeable_ranks, full._special_tokens)
    return _PLAIN[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", ELIGIBLE)
@settings(max_examples=examples(300), deadline=None)
@given(text=PLAIN_TEXT)
def test_plain_texts_encode_alike_without_the_lookahead(name: str, text: str) -> None:
    """The lookahead-free encoding is used only where it gives the full pattern's ids; the
    whole encoder still gives the original's."""
    from tito.types.fast_bpe import _plain

    backend, fast = pair(name)
    assert fast is not None
    full, plain = fast.encoding, plain_of(name)
    assert plain is not None  # every eligible fixture's pattern ends with the lookahead
    if _plain(text):
        assert plain.encode_ordinary(text) == full.encode_ordinary(text)
    assert fast.encode(text) == backend.encode(text, add_special_tokens=False).ids


def test_plain_means_ascii_without_a_whitespace_run() -> None:
    from tito.types.fast_bpe import _plain

    assert _plain("the quick brown fox.\nIt ran: 3 times!\t(ok) \x00 ")
    for text in ("a  b", "a\n\nb", "a \nb", "a\t b", "end\r\n", "caf\u00e9", "a\u00a0b"):
        assert not _plain(text), text


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.integers(0, 12), max_size=20), st.integers(0, 3))
def test_special_ids_are_dropped_as_a_filter_drops_them(ids: list[int], stops: int) -> None:
    """The decoder's ``skip_special`` cut (trailing stop tokens off, the rest kept whole
    when it holds none) gives what filtering every id gives: special ids anywhere, at the
    end only, or none."""
    from itertools import filterfalse

    from tito.types.fast_bpe import _without

    special = frozenset({7, 11, 12})
    seq = [*ids, *[11] * stops]
    assert _without(seq, special) == list(filterfalse(special.__contains__, seq))
    clean = [i for i in seq if i not in special] + [7]
    assert _without(clean, special) == clean[:-1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ELIGIBLE)
@settings(max_examples=examples(100), deadline=None)
@given(data=st.data())
def test_completions_ending_on_special_tokens_decode_as_the_original(
        name: str, data: st.DataObject) -> None:
    """Ordinary ids then special ones (a completion and its stop token), and specials
    inside: the text with special tokens skipped is the original's."""
    backend, fast = pair(name)
    assert fast is not None and fast.decode is not None
    special = [i for i, t in backend.get_added_tokens_decoder().items() if t.special]
    ordinary = st.integers(0, backend.get_vocab_size(with_added_tokens=False) - 1)
    ids = data.draw(st.lists(ordinary, max_size=24))
    ids += data.draw(st.lists(st.sampled_from(special), max_size=2))
    if data.draw(st.booleans()) and ids:
        ids.insert(data.draw(st.integers(0, len(ids))), data.draw(st.sampled_from(special)))
    assert fast.decode(ids, True) == backend.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("text", ["hi there", "word " * 400, "hi<|im_end|>there",
                                  "<|im_end|>" + "word " * 400])
def test_a_caller_changing_its_ids_never_changes_a_later_encode(text: str) -> None:
    backend, codec = pair("qwen3")
    assert codec is not None
    expected = backend.encode(text, add_special_tokens=False).ids
    for _ in range(3):  # the third call reads the kept long piece back
        ids = codec.encode(text)
        assert ids == expected
        ids.append(-1)
        ids[0] = -1
