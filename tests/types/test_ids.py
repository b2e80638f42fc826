"""Buffered random ids (tito/types/ids.py): the same shape as ``os.urandom(n).hex()``,
never repeated, and a forked child does not hand out its parent's bytes."""

from __future__ import annotations

import os
import re

import pytest

from tito.types import ids
from tito.types.ids import CHUNK, random_hex


@pytest.mark.parametrize("nbytes", [1, 4, 16, CHUNK, CHUNK + 3])
def test_random_hex_has_the_shape_of_urandom_hex(nbytes: int) -> None:
    value = random_hex(nbytes)
    assert len(value) == 2 * nbytes
    assert re.fullmatch(r"[0-9a-f]+", value)


def test_ids_do_not_repeat_across_refills() -> None:
    drawn = [random_hex(16) for _ in range(3 * CHUNK // 16 + 5)]  # three refills
    assert len(set(drawn)) == len(drawn)


def test_each_byte_is_handed_out_once() -> None:
    random_hex(1)  # a buffer is there
    buffer, start = ids._buffer, ids._pos
    assert random_hex(4) == buffer[start:start + 4].hex()
    assert random_hex(4) == buffer[start + 4:start + 8].hex()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_draws_other_bytes() -> None:
    random_hex(1)
    parent_next = ids._buffer[ids._pos:ids._pos + 16].hex()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its first id, then leave at once
        os.close(read_end)
        os.write(write_end, random_hex(16).encode())
        os._exit(0)
    os.close(write_end)
    child = os.read(read_end, 64).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    assert len(child) == 32 and child != parent_next
    assert random_hex(16) == parent_next  # the parent goes on where it was
