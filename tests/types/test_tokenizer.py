"""Loading tokenizer folders: one backend per unchanged file in a process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tokenizers

from tito.render.families.loaders import write_standin
from tito.types import tokenizer as tokenizer_module
from tito.types.tokenizer import SHARED_BACKENDS, load_tokenizer, shared_backend

SPECIALS = ("<|im_start|>", "<|im_end|>")


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from an empty process cache (and leaves the session's as it was)."""
    monkeypatch.setattr(tokenizer_module, "_shared", type(tokenizer_module._shared)())


def folder(tmp_path: Path, name: str = "tok") -> Path:
    return write_standin(tmp_path / name, "test", SPECIALS, "<|im_end|>")


def test_loads_of_one_folder_share_the_backend(tmp_path: Path) -> None:
    path = folder(tmp_path)
    first, second = load_tokenizer(path), load_tokenizer(path)
    assert first is not second  # each load its own wrapper (fast encoder, template)...
    assert first.backend is second.backend  # ...over one backend
    assert second.encode("<|im_start|>hello") == first.encode("<|im_start|>hello")


def test_a_changed_file_loads_anew(tmp_path: Path) -> None:
    path = folder(tmp_path)
    first = load_tokenizer(path)
    source = path / "tokenizer.json"
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert load_tokenizer(path).backend is not first.backend


def test_the_cache_keeps_the_last_used_backends(tmp_path: Path) -> None:
    built: list[str] = []

    def load(name: str) -> tokenizers.Tokenizer:
        path = tmp_path / f"{name}.json"
        if not path.exists():
            path.write_text(name)

        def build() -> tokenizers.Tokenizer:
            built.append(name)
            return tokenizers.Tokenizer(tokenizers.models.BPE())

        return shared_backend([path], "test", build)

    first = load("a")
    for i in range(SHARED_BACKENDS - 1):
        load(f"b{i}")
    assert load("a") is first  # used again: now the most recent
    load("c")  # one past the bound: the least recently used (b0) goes
    assert built.count("a") == 1
    load("b0")
    assert built.count("b0") == 2
    assert load("a") is first


def test_a_kind_is_part_of_the_key(tmp_path: Path) -> None:
    path = tmp_path / "ranks"
    path.write_text("x")
    one = shared_backend([path], "tiktoken", lambda: tokenizers.Tokenizer(
        tokenizers.models.BPE()))
    other = shared_backend([path], "tekken", lambda: tokenizers.Tokenizer(
        tokenizers.models.BPE()))
    assert one is not other
