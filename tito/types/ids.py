"""Random hex ids for every turn (response ids, engine request ids), without a system call
per id.

``os.urandom(n).hex()`` is one ``getrandom`` system call per id, and a turn draws two.
:func:`random_hex` gives the same: hex digits of the operating system's random bytes,
read :data:`CHUNK` bytes at a time and handed out in order, each byte once. A forked
child (``tito serve --workers N``) starts with an empty buffer, so two processes never hand
out the same bytes.
"""

from __future__ import annotations

import os
import threading

CHUNK = 4096
"""Random bytes read from the operating system at a time."""

_lock = threading.Lock()
_buffer = b""
_pos = 0


def random_hex(nbytes: int) -> str:
    """``2 * nbytes`` hex digits of fresh random bytes (as ``os.urandom(nbytes).hex()``)."""
    global _buffer, _pos
    with _lock:  # uncontended on the event loop; worker threads may draw too
        end = _pos + nbytes
        if end > len(_buffer):
            _buffer, _pos, end = os.urandom(max(CHUNK, nbytes)), 0, nbytes
        start, _pos = _pos, end
        return _buffer[start:end].hex()


def _reset_after_fork() -> None:
    """A forked child must not hand out the bytes its parent still holds."""
    global _buffer, _pos, _lock
    _lock = threading.Lock()
    _buffer, _pos = b"", 0


os.register_at_fork(after_in_child=_reset_after_fork)
