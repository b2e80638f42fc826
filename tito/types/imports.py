"""Import a trusted object named on the command line: the one rule set of every flag or
option that names user code (agents, matchers, sample hooks, generate functions).

Accepted forms, split at the last ``:`` when there is one:

- ``module:attr``: ``attr`` of the importable module ``module`` (``pkg.sub:fn``);
- ``module.attr``: the same, split at the last dot, where the caller allows it
  (``dotted=True``; the reference RL framework's form);
- ``path/to/file.py:attr``: ``attr`` of a Python file, executed as a fresh module, where
  the caller allows it (``files=True``).

Every failure is a :class:`ConfigError` (CLI exit 2) whose one-line message names what is
loaded (``what``: a flag such as ``--agent``), the spec and the cause::

    --agent 'pkg.agent' must look like module:function or path/to/file.py:function
    cannot load --agent 'pkg:run': cannot import agent module 'pkg': No module named 'pkg'
    cannot load --agent 'pkg:nope': agent module 'pkg' has no attribute 'nope'
    --sample-picker 'hooks:pick' must be a plain function, not async

``cannot load ...: <cause>`` when the spec names nothing importable, ``... must ...`` when
it names an object of the wrong kind (``callable``, ``require_async``, ``refuse_async``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tito.types.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Imported:
    """What a spec named: the object and the module it was read from."""

    value: Any
    module: ModuleType


@dataclass(frozen=True, slots=True)
class _Target:
    source: str
    """A module name, or a file path (``is_file``)."""
    attr: str
    is_file: bool


Fail = Callable[[str], ConfigError]
"""Builds the ``cannot load ...: <cause>`` error of one spec."""


def spec_forms(*, dotted: bool = True, files: bool = False) -> str:
    """The accepted forms, as the messages spell them."""
    forms = ["module:function"] + ["module.function"] * dotted + [
        "path/to/file.py:function"] * files
    return forms[0] if len(forms) == 1 else f"{', '.join(forms[:-1])} or {forms[-1]}"


def _is_module_name(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def _parse(spec: str, what: str, *, dotted: bool, files: bool) -> _Target:
    if ":" in spec:
        source, _, attr = spec.rpartition(":")
    elif dotted:
        source, _, attr = spec.rpartition(".")
    else:
        source = attr = ""
    is_file = files and source.endswith(".py")
    if not attr.isidentifier() or not (is_file or (source and _is_module_name(source))):
        forms = spec_forms(dotted=dotted, files=files)
        raise ConfigError(f"{what} {spec!r} must look like {forms}")
    return _Target(source, attr, is_file)


def _load_file(path: str, fail: Fail, noun: str) -> ModuleType:
    """Execute the file ``path`` as the module ``_tito_file_<stem>`` (kept in sys.modules
    so that its classes pickle and its dataclasses resolve their annotations)."""
    file = Path(path)
    if not file.is_file():
        raise fail(f"no such file {path!r}")
    name = f"_tito_file_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise fail(f"{path!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise fail(f"importing {noun}file {path!r} raised {type(exc).__name__}: {exc}") from exc
    return module


def _load_module(name: str, fail: Fail, noun: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise fail(f"cannot import {noun}module {name!r}: {exc}") from exc
    except Exception as exc:  # the module raised while importing (SyntaxError, ...)
        raise fail(f"importing {noun}module {name!r} raised {type(exc).__name__}: {exc}"
                   ) from exc


def _is_async(value: Any) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(value) or (
        not inspect.isclass(value) and inspect.iscoroutinefunction(type(value).__call__))


def _check(value: Any, spec: str, what: str, *, callable_: bool, require_async: bool,
           refuse_async: bool) -> None:
    if (callable_ or require_async or refuse_async) and not callable(value):
        raise ConfigError(f"{what} {spec!r} must be callable, got {type(value).__name__}")
    if require_async and not _is_async(value):
        raise ConfigError(f"{what} {spec!r} must be an async function (async def ...)")
    if refuse_async and _is_async(value):
        raise ConfigError(f"{what} {spec!r} must be a plain function, not async")


def import_from_spec(spec: str, what: str, *, dotted: bool = True, files: bool = False,
                     noun: str = "", callable_: bool = False, require_async: bool = False,
                     refuse_async: bool = False) -> Imported:
    """The object ``spec`` names (module docstring), with its module.

    ``what`` names the setting in every message (a flag, or e.g. ``message matcher``);
    ``noun`` (e.g. ``agent``) says what the module holds (``cannot import agent module``).
    ``callable_`` refuses a non-callable object, ``require_async`` anything but an async
    function, ``refuse_async`` an async one. Any failure is a :class:`ConfigError`.
    """
    target = _parse(spec, what, dotted=dotted, files=files)
    noun_ = f"{noun} " if noun else ""

    def fail(cause: str) -> ConfigError:
        return ConfigError(f"cannot load {what} {spec!r}: {cause}")

    if target.is_file:
        module = _load_file(target.source, fail, noun_)
    else:
        module = _load_module(target.source, fail, noun_)
    try:
        value = getattr(module, target.attr)
    except AttributeError:
        where = f"file {target.source!r}" if target.is_file else f"module {target.source!r}"
        raise fail(f"{noun_}{where} has no attribute {target.attr!r}") from None
    _check(value, spec, what, callable_=callable_, require_async=require_async,
           refuse_async=refuse_async)
    return Imported(value, module)


def import_object(spec: str, what: str, *, dotted: bool = True, files: bool = False,
                  noun: str = "", callable_: bool = False, require_async: bool = False,
                  refuse_async: bool = False) -> Any:
    """:func:`import_from_spec` without the module: just the object ``spec`` names."""
    return import_from_spec(spec, what, dotted=dotted, files=files, noun=noun,
                            callable_=callable_, require_async=require_async,
                            refuse_async=refuse_async).value
