"""Trusted user functions named on the command line (``module:function`` or a dotted
path): message matchers, sample pickers and postprocessors. Loaded once at startup,
never from a request; an async function is refused (hooks run inside a request's
synchronous work)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from tito.types.errors import ConfigError


def load_function(spec: str, what: str) -> Callable[..., Any]:
    """The function ``spec`` names; :class:`ConfigError` (exit 2) naming ``what`` (e.g.
    ``--sample-picker``) when it cannot be imported, is not callable or is async."""
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
    elif "." in spec:
        module_name, _, attr = spec.rpartition(".")
    else:
        raise ConfigError(f"{what} {spec!r} is not a dotted path (module.function or "
                          "module:function)")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {what} {spec!r}: {exc}") from exc
    if not callable(fn):
        raise ConfigError(f"{what} {spec!r} is not a function")
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
        raise ConfigError(f"{what} {spec!r} must be a plain function, not async")
    return fn
