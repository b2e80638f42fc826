"""Counting a completion's reasoning ids (``usage`` ``reasoning_tokens``): exactly the
generated ids through the family's reasoning end token, counted on the ids (never by
re-tokenizing the reasoning text); all of them when the completion was cut inside the
reasoning; none without reasoning."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from helpers.support import examples, tokenizer_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from tito.parse.base import ids_through
from tito.parse.harmony import HarmonyParser
from tito.parse.hermes import HermesParser
from tito.render import TemplateRenderer, build_renderer
from tito.render.families import family_module
from tito.types.fast_bpe import bytes_to_unicode
from tito.types.tokenizer import load_tokenizer

_CACHE: dict[str, TemplateRenderer] = {}
FIXTURES = {"qwen3": "qwen3"}
FAMILIES = ["qwen3", "qwen3_thinking", "qwen35", "nemotron3", "glm47", "deepseek_v31",
            "deepseek_v32", "deepseek_v4", "kimi_k2", "minimax_m2", "gpt_oss",
            "minimax_m25",
            "minimax_m3",
            "gemma4",
            "qwen38",
            "qwen36",
            "nemotron35",
            "glm5",
            "kimi_k25",
            "kimi_k3",
            "deepseek_v41",
            "inkling",
            ]
SLOW = ("qwen35", "gpt_oss")  # the two long templates: about a second each
END = {"gpt_oss": "<|end|>", "minimax_m3": "</mm:think>", "gemma4": "<channel|>",
       "kimi_k3": "<|close|>think<|sep|>", "inkling": "<|end_message|>"}
REASONING, ANSWER = "think hard about it", "The answer is 42."


def get(family: str) -> TemplateRenderer:
    if family not in _CACHE:
        fixture = getattr(family_module(family), "FIXTURE", None) or FIXTURES.get(family)
        _CACHE[family] = build_renderer(family, tokenizer_dir(fixture) if fixture else "standin")
    return _CACHE[family]


def completion(r: TemplateRenderer, reasoning: str | None) -> list[int]:
    message = {"role": "assistant", "content": ANSWER}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    kwarg = r.spec.thinking_kwarg
    return r.render_completion(message, template_kwargs={kwarg: reasoning is not None}
                               if kwarg else None)


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW
                                    else f for f in FAMILIES])
def test_reasoning_ids_end_with_the_reasoning_end_token(family: str) -> None:
    r = get(family)
    ids = completion(r, REASONING)
    parsed = r.parse(ids, "stop")
    assert parsed.reasoning_content == REASONING and parsed.content == ANSWER
    n = r.reasoning_tokens(ids, parsed)
    end = END.get(family, "</think>")
    head = r.tokenizer.decode(ids[:n])  # its last id completes the end marker
    assert end in head and end not in r.tokenizer.decode(ids[: n - 1])
    assert REASONING in head.split(end)[0] and ANSWER not in head
    # cut inside the reasoning: every generated id is reasoning
    cut = ids[: max(1, n - 3)]
    cut_parse = r.parse(cut, "length")
    assert r.reasoning_tokens(cut, cut_parse) == (len(cut) if cut_parse.reasoning_content
                                                  is not None else 0)


@pytest.mark.parametrize("family", ["qwen3", "glm47", "deepseek_v31", "kimi_k2",
                                    "glm5", "kimi_k25", "kimi_k3", "inkling"])
def test_no_reasoning_counts_nothing(family: str) -> None:
    r = get(family)
    ids = completion(r, None)
    parsed = r.parse(ids, "stop")
    assert parsed.reasoning_content in (None, "")
    expected = 0 if parsed.reasoning_content is None else \
        ids_through(r.tokenizer, ids, "</think>")
    assert r.reasoning_tokens(ids, parsed) == expected


def test_qwen3_counts_through_the_think_end_id() -> None:
    r = get("qwen3")
    ids = completion(r, REASONING)
    end = r.tokenizer.require_id("</think>")
    assert r.reasoning_tokens(ids, r.parse(ids, "stop")) == ids.index(end) + 1
    empty = completion(r, "")  # thinking on, nothing thought: <think>, "\n\n", </think>
    assert r.reasoning_tokens(empty, r.parse(empty, "stop")) == empty.index(end) + 1 == 3
    stray = r.tokenizer.encode("text</think> more")  # not a reasoning block
    parsed = r.parse(stray, "stop")
    assert r.reasoning_tokens(stray, parsed) == (0 if parsed.reasoning_content is None
                                                 else stray.index(end) + 1)


def test_a_marker_spelled_in_pieces_is_found_on_the_ids() -> None:
    tok = load_tokenizer(tokenizer_dir("smollm2"))
    assert tok.token_to_id("</think>") is None  # several tokens in this vocabulary
    ids = tok.encode("<think>a long thought</think>The answer.")
    n = ids_through(tok, ids, "</think>")
    assert n is not None
    assert tok.decode(ids[:n]).endswith("</think>")
    assert "</think>" not in tok.decode(ids[: n - 1])
    assert ids_through(tok, ids[: n - 1], "</think>") is None


def test_harmony_counts_each_analysis_message() -> None:
    tok = load_tokenizer(tokenizer_dir("gpt-oss"))
    parser = HarmonyParser(tok, stop_texts=("<|return|>", "<|call|>"))
    analysis = "<|channel|>analysis<|message|>first thought<|end|>"
    call = ('<|start|>assistant to=functions.f<|channel|>commentary json<|message|>'
            '{"a": 1}<|call|>')
    second = "<|start|>assistant<|channel|>analysis<|message|>more<|end|>"
    final = "<|start|>assistant<|channel|>final<|message|>Done.<|return|>"
    ids = tok.encode(analysis + second + final)
    parsed = parser.parse(ids, "stop")
    assert parsed.reasoning_content == "first thought\nmore"
    assert parser.reasoning_tokens(ids, parsed) == len(tok.encode(analysis + second))
    ids = tok.encode(analysis + call)
    assert parser.reasoning_tokens(ids, parser.parse(ids, "stop")) == \
        len(tok.encode(analysis))


_FAST: dict[str, object] = {}


def fast_qwen3() -> object:
    """qwen3's tokenizer with its fast (byte-level) decoder built."""
    if "qwen3" not in _FAST:
        tok = load_tokenizer(tokenizer_dir("qwen3"))
        thread = tok.start_fast_encoder()
        assert thread is not None
        thread.join()
        assert tok.fast_decode is not None
        _FAST["qwen3"] = tok
    return _FAST["qwen3"]


@pytest.mark.slow  # builds the fast codec (~1-2 s)
@settings(max_examples=examples(300), deadline=None)
@given(data=st.data())
def test_the_parsed_text_gives_what_decoding_gives(data: st.DataObject) -> None:
    """``ids_through`` with the completion's text (what the Hermes parse keeps) against
    decoding prefixes: the marker's id once or more, the marker also spelled out in
    pieces, bytes of a split UTF-8 character just before it, special tokens, or neither;
    and the Hermes parser's count through its kept text equals the count without it."""
    tok: Any = fast_qwen3()
    byte = bytes_to_unicode()
    pieces = [tok.encode(t) for t in (" the", " fox", "\n", "<", "/", "think", ">", "</",
                                      "think>", "é", "<think>", "</think>", "<|im_end|>",
                                      "<|im_start|>")]
    pieces += [[tok.token_to_id(byte[b])] for b in (0xE2, 0x82, 0xC3)]  # split UTF-8
    ids = [i for part in data.draw(st.lists(st.sampled_from(pieces), max_size=24))
           for i in part]
    for skip in (True, False):
        text = tok.decode(ids, skip_special_tokens=skip)
        assert ids_through(tok, ids, "</think>", skip_special_tokens=skip, text=text) == \
            ids_through(tok, ids, "</think>", skip_special_tokens=skip)
    parser = HermesParser(tok)
    parsed = parser.parse(ids, "stop")
    assert parser.reasoning_tokens(ids, parsed) == parser.reasoning_tokens(
        ids, replace(parsed, decoded=None))
