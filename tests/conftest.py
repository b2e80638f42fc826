"""Shared fixtures (helpers live in support.py, fakes.py and inproc.py, importable from
every test module). In-process fixtures build the real app over a :class:`FakeEngine`."""

from __future__ import annotations

import os
import re

# every response body the gateway sends in a test is validated against its declared type
# (tito.server.openai.models.Wire); set before tito is imported, inherited by subprocesses
os.environ["TITO_CHECK_WIRE"] = "1"

import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.fakes import FakeEngine
from helpers.inproc import asgi_client
from helpers.support import EXAMPLES_SCALE, Proc, start_gateway, start_mock, tokenizer_dir
from helpers.tls import share_default_tls_context

from tito.config import ServerConfig
from tito.render import build_renderer
from tito.render.base import TemplateRenderer
from tito.render.verify import verify_renderer
from tito.server.gateway import Gateway

# Byte-code caching on for the suite and every process it starts, whatever the shell says:
# under PYTHONDONTWRITEBYTECODE each pytest worker, and each gateway or mock a test starts,
# compiled tito and the rewritten test modules from source again on every run (half of
# a worker's collection time). The .pyc files go to __pycache__/ (ignored by git).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
share_default_tls_context()


def pytest_configure(config: pytest.Config) -> None:
    """The fast tier (``-m "not slow"``) runs a quarter of each property test's examples
    (support.examples); the full suite runs them all."""
    if "not slow" in (config.option.markexpr or ""):
        os.environ.setdefault(EXAMPLES_SCALE, "0.25")


_WHOLLY_SLOW = re.compile(r"^pytestmark = (?:pytest\.mark\.slow\b|\[[^\]]*\bpytest\.mark\.slow\b)",
                          re.MULTILINE)
"""A module-level ``pytestmark`` that marks every test of the module slow."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast tier does not import the modules it would deselect whole: their imports
    (torch, ray, vLLM...) cost each xdist worker seconds of collection for nothing."""
    if config.option.markexpr != "not slow" or collection_path.suffix != ".py" or \
            not collection_path.name.startswith("test_"):
        return None
    return True if _WHOLLY_SLOW.search(collection_path.read_text()) else None


@pytest.fixture(scope="session")
def qwen3_dir() -> Path:
    return tokenizer_dir("qwen3")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return tokenizer_dir("smollm2")


@pytest.fixture(scope="session")
def qwen3_stack(qwen3_dir: Path) -> Iterator[tuple[Proc, Proc]]:
    """`tito mock-engine` + `tito serve` for qwen3, as real processes on ephemeral ports."""
    engine = start_mock(qwen3_dir, "qwen3")
    try:
        gateway = start_gateway(engine.url, qwen3_dir, "qwen3", "--max-body-bytes", "2000000")
    except Exception:
        engine.stop()
        raise
    try:
        yield engine, gateway
    finally:
        gateway.stop()
        engine.stop()


@pytest.fixture
def stack(qwen3_stack: tuple[Proc, Proc]) -> tuple[Proc, Proc]:
    """``qwen3_stack`` with the mock's request log cleared."""
    engine, _ = qwen3_stack
    httpx.delete(engine.url + "/mock/requests")
    return qwen3_stack


@pytest.fixture(scope="session")
def qwen3_renderer(qwen3_dir: Path) -> TemplateRenderer:
    return build_renderer("qwen3", qwen3_dir)


@pytest.fixture(scope="session")
def qwen3_self_check(qwen3_renderer: TemplateRenderer) -> dict[str, Any]:
    return verify_renderer(qwen3_renderer).summary()


@pytest.fixture
def make_gateway(qwen3_dir: Path, qwen3_renderer: TemplateRenderer,
                 qwen3_self_check: dict[str, Any]) -> Callable[..., Gateway]:
    """``make_gateway(**config)``: a qwen3 Gateway over a fresh FakeEngine."""

    def make(*, context: int | None = None, **config: Any) -> Gateway:
        cfg = ServerConfig(tokenizer=str(qwen3_dir), family="qwen3", engine="sglang",
                           engine_url="http://fake", **config)
        cfg.validate()
        return Gateway(cfg, qwen3_renderer, FakeEngine(qwen3_renderer, context=context),
                       self_check=qwen3_self_check)

    return make


@pytest.fixture
def gateway(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway()


@pytest.fixture
def engine(gateway: Gateway) -> FakeEngine:
    assert isinstance(gateway.engine, FakeEngine)
    return gateway.engine


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(gateway) as http:
        yield http
