"""The one import-by-path rule set (``tito.types.imports``): forms, checks and messages."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tito.types.errors import ConfigError, ErrorKind
from tito.types.hooks import load_function
from tito.types.imports import import_from_spec, import_object, spec_forms

MODULE = "tito_imports_fixture"


def plain(x: int) -> int:
    return x


async def coro(x: int) -> int:
    return x


class AsyncCallable:
    async def __call__(self, x: int) -> int:
        return x


@pytest.fixture(autouse=True)
def fixture_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A module importable as ``tito_imports_fixture`` (and nothing left behind)."""
    mod = types.ModuleType(MODULE)
    mod.plain = plain  # type: ignore[attr-defined]
    mod.coro = coro  # type: ignore[attr-defined]
    mod.number = 3  # type: ignore[attr-defined]
    mod.async_callable = AsyncCallable()  # type: ignore[attr-defined]
    mod.Klass = AsyncCallable  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MODULE, mod)
    before = set(sys.modules)
    yield mod
    for name in set(sys.modules) - before:
        if name.startswith("_tito_file_"):
            del sys.modules[name]


def message(spec: str, what: str = "--hook", **options: Any) -> str:
    with pytest.raises(ConfigError) as info:
        import_object(spec, what, **options)
    assert info.value.kind is ErrorKind.CONFIG
    assert "\n" not in str(info.value)
    return str(info.value)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- the forms ----------------------------------------------------------------------------
def test_colon_form() -> None:
    assert import_object(f"{MODULE}:plain", "--hook") is plain
    assert import_object("os.path:join", "--hook") is os.path.join


def test_dotted_form_where_allowed() -> None:
    assert import_object(f"{MODULE}.plain", "--hook") is plain
    assert import_object("os.path.join", "--hook", dotted=True) is os.path.join
    assert "must look like module:function" in message(f"{MODULE}.plain", dotted=False)


def test_file_form_where_allowed(tmp_path: Path) -> None:
    path = write(tmp_path, "my_agent.py", "def run():\n    return 7\n\nabort = 1\n")
    found = import_from_spec(f"{path}:run", "--agent", files=True)
    assert found.value() == 7 and found.module.abort == 1
    assert found.module.__name__ == "_tito_file_my_agent"
    assert sys.modules["_tito_file_my_agent"] is found.module
    # without files=True a path is no module name
    assert message(f"{path}:run", dotted=False) == (
        f"--hook '{path}:run' must look like module:function")


def test_file_path_with_a_colon_splits_at_the_last_one(tmp_path: Path) -> None:
    folder = tmp_path / "a:b"
    folder.mkdir()
    path = write(folder, "colon_agent.py", "def run():\n    return 1\n")
    assert import_object(f"{path}:run", "--agent", files=True)() == 1


@pytest.mark.parametrize("spec", ["plain", "", ":plain", f"{MODULE}:", f"{MODULE}.",
                                  f"{MODULE}:not-an-identifier", "a b:plain", "a/b:plain"])
def test_malformed_specs(spec: str) -> None:
    assert message(spec) == (f"--hook {spec!r} must look like module:function or "
                             "module.function")


def test_forms_named_in_messages() -> None:
    assert spec_forms(dotted=False) == "module:function"
    assert spec_forms(dotted=False, files=True) == "module:function or path/to/file.py:function"
    assert spec_forms(dotted=True, files=True) == (
        "module:function, module.function or path/to/file.py:function")
    assert "module.function or path/to/file.py" in message("plain", files=True)


# -- what cannot be loaded ----------------------------------------------------------------
def test_missing_module() -> None:
    assert message("tito_no_such_module_xyz:f", "--sample-picker") == (
        "cannot load --sample-picker 'tito_no_such_module_xyz:f': cannot import module "
        "'tito_no_such_module_xyz': No module named 'tito_no_such_module_xyz'")
    assert "cannot import agent module 'tito_no_such_module_xyz'" in message(
        "tito_no_such_module_xyz:f", noun="agent")


def test_module_that_raises_while_importing(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "tito_broken_fixture.py", "raise RuntimeError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert message("tito_broken_fixture:f") == (
        "cannot load --hook 'tito_broken_fixture:f': importing module 'tito_broken_fixture' "
        "raised RuntimeError: broken on purpose")
    monkeypatch.delitem(sys.modules, "tito_broken_fixture", raising=False)


def test_missing_attribute() -> None:
    assert message(f"{MODULE}:nope", "message matcher") == (
        f"cannot load message matcher '{MODULE}:nope': module '{MODULE}' has no attribute "
        "'nope'")
    assert f"agent module '{MODULE}' has no attribute 'nope'" in message(
        f"{MODULE}.nope", noun="agent")


def test_missing_file_and_file_errors(tmp_path: Path) -> None:
    missing = tmp_path / "absent.py"
    assert message(f"{missing}:run", "--agent", files=True) == (
        f"cannot load --agent '{missing}:run': no such file '{missing}'")
    broken = write(tmp_path, "broken_file.py", "raise ValueError('no luck')\n")
    assert message(f"{broken}:run", "--agent", files=True, noun="agent") == (
        f"cannot load --agent '{broken}:run': importing agent file '{broken}' raised "
        "ValueError: no luck")
    assert "_tito_file_broken_file" not in sys.modules
    empty = write(tmp_path, "empty_file.py", "")
    assert message(f"{empty}:run", "--agent", files=True) == (
        f"cannot load --agent '{empty}:run': file '{empty}' has no attribute 'run'")


# -- what the object must be --------------------------------------------------------------
def test_not_callable() -> None:
    assert message(f"{MODULE}:number", callable_=True) == (
        f"--hook '{MODULE}:number' must be callable, got int")
    assert import_object(f"{MODULE}:number", "--hook") == 3  # no check asked


def test_async_refused() -> None:
    for name in ("coro", "async_callable"):
        assert message(f"{MODULE}:{name}", "--sample-picker", refuse_async=True) == (
            f"--sample-picker '{MODULE}:{name}' must be a plain function, not async")
    assert import_object(f"{MODULE}:plain", "--hook", refuse_async=True) is plain
    assert import_object(f"{MODULE}:Klass", "--hook", refuse_async=True) is AsyncCallable


def test_async_required() -> None:
    assert import_object(f"{MODULE}:coro", "--agent", require_async=True) is coro
    assert isinstance(import_object(f"{MODULE}:async_callable", "--agent",
                                    require_async=True), AsyncCallable)
    for name in ("plain", "Klass"):
        assert message(f"{MODULE}:{name}", "--agent", require_async=True) == (
            f"--agent '{MODULE}:{name}' must be an async function (async def ...)")
    assert "must be callable, got int" in message(f"{MODULE}:number", require_async=True)


def test_error_keeps_its_cause() -> None:
    with pytest.raises(ConfigError) as info:
        import_object("tito_no_such_module_xyz:f", "--hook")
    assert isinstance(info.value.__cause__, ImportError)


# -- the hooks' wrapper -------------------------------------------------------------------
def test_load_function_is_the_helper_with_the_hooks_rules() -> None:
    assert load_function(f"{MODULE}.plain", "--sample-picker") is plain
    assert load_function(f"{MODULE}:plain", "--sample-picker") is plain
    with pytest.raises(ConfigError, match=r"--sample-picker '.*:coro' must be a plain "
                                          r"function, not async"):
        load_function(f"{MODULE}:coro", "--sample-picker")
    with pytest.raises(ConfigError, match=r"must be callable"):
        load_function(f"{MODULE}:number", "--sample-picker")
    with pytest.raises(ConfigError, match=r"cannot load --sample-postprocessor 'x_no:f'"):
        load_function("x_no:f", "--sample-postprocessor")
