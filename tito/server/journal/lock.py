"""One gateway (or one ``tito journal check --repair``) per journal folder: an exclusive
``flock`` on ``DIR/journal.lock``, released when its holder exits, however it exits."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tito.types.errors import ConfigError

LOCK = "journal.lock"


def take(folder: Path) -> int:
    """The lock's fd (ConfigError when another process holds it)."""
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise ConfigError(f"--journal {str(folder)!r} is in use by another process (a "
                          "running gateway, or `tito journal check --repair`); stop it "
                          "first") from exc
    return fd


@contextmanager
def hold(folder: Path) -> Iterator[None]:
    fd = take(folder)
    try:
        yield
    finally:
        os.close(fd)
