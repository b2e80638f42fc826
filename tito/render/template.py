"""Rendering Jinja chat templates the way Hugging Face does, without ``transformers``.

The same sandbox (its decisions cached, :class:`_Sandbox`), the same ``tojson`` filter
(non-ASCII kept, keys in insertion order), ``raise_exception`` and ``strftime_now``
globals, ``trim_blocks``/``lstrip_blocks``.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import orjson
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tito.types.errors import TokenizationError


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    if type(value) is dict or type(value) is list:
        return _tojson_container(value, ensure_ascii, indent, separators, sort_keys)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


_TOJSON: dict[tuple[bytes, bool, int | None, tuple[str, ...] | None, bool], str] = {}
TOJSON_ENTRIES = 4096
"""How many container renders :func:`_tojson_container` keeps (then it starts over)."""


def _tojson_container(value: dict[str, Any] | list[Any], ensure_ascii: bool,
                      indent: int | None, separators: tuple[str, str] | None,
                      sort_keys: bool) -> str:
    """``json.dumps`` of a dict or list, remembered by its ``orjson`` text: the tool list
    is rendered into the template every turn (twice or more: the bridge's base, its
    skeleton), and a Claude Code tool list is ~30 KB, which ``json.dumps`` writes about
    five times slower than ``orjson``. Exact: ``orjson``'s text fixes the types (``1``,
    ``1.0``, ``true``), the key order and every string, so ``json.dumps`` writes the same
    for any value with that text, except for ``null``, which ``orjson`` also writes for NaN
    and infinities (``json.dumps``: ``NaN``, ``Infinity``): a text with a ``null`` value in
    it, or a value ``orjson`` refuses (non-str keys, other types), is not remembered."""
    try:
        text = orjson.dumps(value)
        if b":null" in text or b"[null" in text or b",null" in text:
            raise TypeError("null: maybe NaN")
        key = (text, bool(ensure_ascii), indent,
               None if separators is None else tuple(separators), bool(sort_keys))
        out = _TOJSON.get(key)  # (a key that cannot be hashed raises TypeError)
    except TypeError:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)
    if out is None:
        out = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                         separators=separators, sort_keys=sort_keys)
        if len(_TOJSON) >= TOJSON_ENTRIES:
            _TOJSON.clear()
        _TOJSON[key] = out
    return out


_DICT_ATTRIBUTES = frozenset(dir(dict))


class _Sandbox(ImmutableSandboxedEnvironment):
    """Hugging Face's sandbox with the same decisions, made faster on the hot path:

    - ``message.role`` on a plain dict reads the key directly (the base class first tries
      ``getattr`` on the dict, which raises, then the key): same result, no exception;
    - whether an attribute is safe depends only on the object's type and the attribute's
      name (the base checks are ``isinstance`` tests and name prefixes), so it is decided
      once per (type, name).
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._safe: dict[tuple[type, str], bool] = {}

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        safe = self._safe.get(key)
        if safe is None:
            safe = super().is_safe_attribute(obj, attr, value)
            if len(self._safe) < 4096:
                self._safe[key] = safe
        return safe


@lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def render_template(
    source: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    kwargs: dict[str, Any] | None = None,
    special_tokens: dict[str, str | None] | None = None,
) -> str:
    """Render ``messages`` with the chat template ``source``; errors become 400s."""
    context: dict[str, Any] = dict(special_tokens or {})
    context.update(kwargs or {})
    context.update(messages=messages, tools=tools or None,
                   add_generation_prompt=add_generation_prompt)
    try:
        return compile_template(source).render(**context)
    except jinja2.exceptions.TemplateError as exc:
        raise TokenizationError(f"chat template rendering failed: {exc}") from exc
    except (TypeError, AttributeError, KeyError) as exc:
        raise TokenizationError(
            f"chat template rendering failed ({type(exc).__name__}: {exc}); "
            "check message contents and tool-call arguments"
        ) from exc
