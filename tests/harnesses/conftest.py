"""The harness suite's fixtures: one mock engine with a v1 and a v2 gateway for the whole
run, and no network but loopback while a harness runs (helpers/harness.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.harness import HarnessStack, harness_stack, loopback_only, offline_env

offline_env()  # before any harness library is imported: some read it once at import


@pytest.fixture(scope="session")
def harness() -> Iterator[HarnessStack]:
    with harness_stack() as stack:
        yield stack


@pytest.fixture(autouse=True)
def _loopback_only() -> Iterator[None]:
    with loopback_only():
        yield
