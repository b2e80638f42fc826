"""The template sandbox keeps Hugging Face's decisions with its faster lookups: dict keys
and dict methods resolve as before, unsafe attributes and mutations are still refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.support import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from tito.render.template import _tojson, render_template
from tito.types.errors import TokenizationError


def render(source: str, **context: object) -> str:
    return render_template(source, [{"role": "user", "content": "hi", "items": "key"}],
                           kwargs=dict(context))


def test_dict_keys_and_methods_resolve_as_before() -> None:
    assert render("{{ messages[0].role }}|{{ messages[0].content }}") == "user|hi"
    assert render("{{ messages[0].missing is defined }}") == "False"
    # a key named like a dict method: the method wins, as in Hugging Face's sandbox
    assert render("{{ messages[0].items is callable }}") == "True"
    assert render("{{ messages[0]['items'] }}") == "key"
    assert render("{% for k, v in messages[0].items() %}{{ k }};{% endfor %}") == \
        "role;content;items;"


@pytest.mark.parametrize("source", [
    "{{ messages.append(1) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{{ ''.__class__.__mro__ }}",
])
def test_unsafe_access_is_still_refused(source: str) -> None:
    with pytest.raises(TokenizationError, match="chat template rendering failed"):
        render(source)


def test_private_attributes_render_nothing() -> None:
    assert render("{{ raise_exception.__globals__ }}") == ""  # an unsafe undefined


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=8)
    | st.floats(allow_nan=True, allow_infinity=True),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12)


@settings(max_examples=examples(300), deadline=None)
@given(value=JSON_VALUES, ensure_ascii=st.booleans(), sort_keys=st.booleans(),
       indent=st.sampled_from([None, 2]),
       separators=st.sampled_from([None, (",", ":"), [", ", ": "]]))
def test_tojson_is_json_dumps_remembered_or_not(value: Any, ensure_ascii: bool,
                                                sort_keys: bool, indent: int | None,
                                                separators: Any) -> None:
    """The ``tojson`` filter remembers container texts by their ``orjson`` text and writes
    exactly what ``json.dumps`` writes, NaN, infinities, ``1``/``1.0``/``true`` included."""
    options = {"ensure_ascii": ensure_ascii, "sort_keys": sort_keys, "indent": indent,
               "separators": separators}
    for _ in range(2):  # the second call can be answered from memory
        assert _tojson(value, **options) == json.dumps(value, **options)


def test_tojson_tells_apart_what_orjson_writes_alike() -> None:
    for a, b in [({"x": None}, {"x": float("nan")}), ([1], [1.0]), ([1], [True]),
                 ([float("inf")], [None])]:
        assert _tojson(a) == json.dumps(a, ensure_ascii=False)
        assert _tojson(b) == json.dumps(b, ensure_ascii=False)
        assert _tojson(a) != _tojson(b)
