"""The prompt-ids JSON cache: always the text of the whole prompt, reusing the previous one."""

from __future__ import annotations

import numpy as np
import orjson
from helpers.support import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from tito.engines.prompt_json import ENTRIES_PER_REQUEST, MIN_ENTRIES, PromptJson, prompt_key


def text_of(ids: list[int]) -> bytes:
    return orjson.dumps(ids)


def test_a_growing_prompt_reuses_the_previous_text() -> None:
    cache = PromptJson()
    prompt = [151644, 872, 198]
    assert cache.ids_json("s", prompt) == text_of(prompt)
    assert cache.reused == 0
    for turn in range(5):
        prompt = [*prompt, turn, 100 + turn, 151645]  # output + bridge of the turn
        assert cache.ids_json("s", np.asarray(prompt, dtype=np.int32)) == text_of(prompt)
    assert cache.reused == 5
    assert cache.ids_json("s", prompt) == text_of(prompt)  # the same prompt again (a retry)
    assert cache.reused == 6


def test_a_prompt_that_does_not_extend_the_entry_is_serialized_whole() -> None:
    cache = PromptJson()
    cache.ids_json("s", [1, 2, 3, 4])
    assert cache.ids_json("s", [1, 2, 9, 4, 5]) == text_of([1, 2, 9, 4, 5])  # branched
    assert cache.ids_json("s", [1, 2]) == text_of([1, 2])  # rolled back
    assert cache.reused == 0
    assert cache.ids_json("s", [1, 2, 7]) == text_of([1, 2, 7])  # extends the new entry
    assert cache.reused == 1


def test_sessions_do_not_share_entries() -> None:
    cache = PromptJson()
    cache.ids_json("a", [1, 2, 3])
    assert cache.ids_json("b", [1, 2, 3, 4]) == text_of([1, 2, 3, 4])
    assert cache.reused == 0 and len(cache) == 2


def test_only_gateway_turns_are_kept() -> None:
    assert prompt_key("sess_t000003_0a1b2c3d") == "sess"
    assert prompt_key("r1") is None  # a one-off request: nothing to reuse
    cache = PromptJson()
    assert cache.ids_json(None, [1, 2]) == b"[1,2]"
    assert len(cache) == 0 and cache.nbytes == 0


def test_empty_prompts() -> None:
    cache = PromptJson()
    assert cache.ids_json("s", []) == b"[]"
    assert cache.ids_json("s", [5]) == b"[5]"
    assert cache.ids_json("s", []) == b"[]"


def test_the_byte_budget_evicts_least_recently_used_sessions() -> None:
    ids = list(range(1000, 1100))  # 400 raw bytes + 500 text bytes
    cache = PromptJson(max_bytes=2000)
    cache.ids_json("a", ids)
    cache.ids_json("b", ids)
    cache.ids_json("a", ids)  # a is now the most recent
    cache.ids_json("c", ids)  # over budget: b goes
    assert len(cache) == 2 and cache.nbytes <= 2000
    reused = cache.reused
    cache.ids_json("b", ids)
    assert cache.reused == reused  # b was evicted: serialized whole
    too_big = PromptJson(max_bytes=100)
    assert too_big.ids_json("s", ids) == text_of(ids)
    assert len(too_big) == 0 and too_big.nbytes == 0


def test_the_entry_budget_follows_the_peak_of_requests_in_flight() -> None:
    """Idle sessions do not keep their prompt text: only the most recent
    ``max(MIN_ENTRIES, ENTRIES_PER_REQUEST * peak in flight)`` sessions do."""
    cache = PromptJson()
    assert cache.max_entries == MIN_ENTRIES
    for i in range(MIN_ENTRIES + 10):
        cache.ids_json(f"s{i}", [1, 2, 3])
    assert len(cache) == MIN_ENTRIES
    assert cache.ids_json("s0", [1, 2, 3, 4]) == b"[1,2,3,4]"  # evicted: whole
    reused = cache.reused
    assert cache.ids_json(f"s{MIN_ENTRIES + 9}", [1, 2, 3, 5]) == b"[1,2,3,5]"
    assert cache.reused == reused + 1  # recent: spliced
    peak = MIN_ENTRIES // ENTRIES_PER_REQUEST + 5
    for _ in range(peak):
        cache.begin()
    for _ in range(peak):
        cache.end()
    assert cache.in_flight == 0 and cache.peak_in_flight == peak
    assert cache.max_entries == ENTRIES_PER_REQUEST * peak  # the peak is kept
    for i in range(2 * ENTRIES_PER_REQUEST * peak):
        cache.ids_json(f"t{i}", [7])
    assert len(cache) == ENTRIES_PER_REQUEST * peak


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 8),
                          st.lists(st.integers(0, 2**31 - 1), max_size=6)), max_size=12))
def test_any_sequence_of_prompts_gives_exact_text(
        steps: list[tuple[int, int, list[int]]]) -> None:
    """Each step: a session, ids kept of its last prompt, new ids appended."""
    cache = PromptJson(max_bytes=300)
    last: dict[int, list[int]] = {}
    for session, keep, new in steps:
        prompt = last.get(session, [])[:keep] + new
        assert cache.ids_json(str(session), prompt) == text_of(prompt)
        last[session] = prompt
    assert cache.nbytes <= 300


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 8), st.integers(0, 6),
                          st.booleans()), max_size=12))
def test_numpy_views_of_a_shared_buffer_give_exact_text(
        steps: list[tuple[int, int, int, bool]]) -> None:
    """The ids compared and appended from the array's own memory (no copy of its bytes):
    prompts that are views of one buffer (as a session's snapshot storage is), strided
    views, prompts shorter than the stored one, and the buffer written over in place
    between two turns (a rollback's truncate and extend) all give orjson's text."""
    storage = np.arange(1, 257, dtype=np.int32)
    cache = PromptJson()
    last = {0: 0, 1: 0}
    for i, (session, keep, new, strided) in enumerate(steps):
        end = min(last[session], keep) + new
        if keep < last[session]:  # rolled back: the ids past ``end - new`` are rewritten
            storage[end - new:end] += 1000 + i
        prompt = storage[: 2 * end : 2] if strided else storage[:end]
        assert cache.ids_json(str(session), prompt) == text_of(prompt.tolist())
        last[session] = end
