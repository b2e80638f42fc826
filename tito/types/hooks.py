"""Trusted user functions named on the command line (``module:function`` or a dotted
path): message matchers, sample pickers and postprocessors. Loaded once at startup,
never from a request; an async function is refused (hooks run inside a request's
synchronous work)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tito.types.imports import import_object


def load_function(spec: str, what: str) -> Callable[..., Any]:
    """The function ``spec`` names; :class:`~tito.types.errors.ConfigError` (exit 2) naming
    ``what`` (e.g. ``--sample-picker``) when it cannot be imported, is not callable or is
    async. The rules and messages are :func:`tito.types.imports.import_object`'s."""
    fn: Callable[..., Any] = import_object(spec, what, dotted=True, callable_=True,
                                           refuse_async=True)
    return fn
