"""The client library's input errors (``tito rollout``'s ``--agent`` and ``--data``)."""

from __future__ import annotations

from tito.types.errors import ConfigError


class RolloutInputError(ConfigError, ValueError):
    """Bad ``--agent`` or ``--data`` input; the message is one line for the user (a
    :class:`ConfigError`: CLI exit 2; also a ``ValueError``, as it always was)."""
