"""``check_depth``: the nesting limit, counted from the field (level 1), for dicts and
lists alike, up to the largest ``--max-json-depth`` without a recursion error."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tito.server.http import check_depth
from tito.types.errors import BadRequest


def nested(depth: int, leaf: Any = "x") -> Any:
    """``depth`` levels of containers, alternating lists and dicts."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.mark.parametrize("limit", [4, 64, 512])
def test_the_limit_is_counted_from_the_field(limit: int) -> None:
    check_depth({"messages": nested(limit), "model": "m", "n": 1}, limit)
    with pytest.raises(BadRequest) as info:
        check_depth({"model": "m", "messages": nested(limit + 1)}, limit)
    assert info.value.code == "json_too_deep"
    assert "messages nests JSON deeper than" in str(info.value)


def test_the_deepest_json_orjson_parses_is_refused_not_a_recursion_error() -> None:
    deep = orjson.loads(b"[" * 1024 + b"]" * 1024)
    with pytest.raises(BadRequest, match="tools nests JSON deeper than 512 levels"):
        check_depth({"tools": deep}, 512)


def test_scalars_and_shallow_values_pass() -> None:
    check_depth({"a": 1, "b": "s", "c": None, "d": [1, 2, {"e": [3]}]}, 4)
