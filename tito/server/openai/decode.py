"""Chat Completions bodies, decoded past the session's last one (design §7.1).

A body that extends the session's last one is parsed and validated only past it
(:mod:`tito.server.growing_body`), and its earlier messages, the same objects as last
time, are neither compared with the session's stored messages nor scanned again.

Pure: no I/O. The state lives in the session's :class:`~tito.server.api_state.ApiState`
(``chat_body``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tito.server.api_state import LastBodies
from tito.server.growing_body import GrowingBody, share
from tito.server.http import decode_growing
from tito.server.openai.convert import has_developer, sampling_params
from tito.server.openai.models import ChatCompletionRequest, validate_chat
from tito.types.engine import SamplingParams
from tito.types.messages import Message


@dataclass(slots=True)
class LastBody:
    """A session's last valid chat body: what the next one may extend (never changed)."""

    parsed: GrowingBody | None
    request: ChatCompletionRequest
    stored: list[Message] | None
    """The stored messages its messages were found to start with (None: they did not)."""
    developer: bool
    """Whether any of its messages has the ``developer`` role."""
    params: SamplingParams
    default_max_tokens: int


@dataclass(slots=True)
class DecodedChat:
    data: dict[str, Any]
    """The body as sent."""
    request: ChatCompletionRequest
    """Its validated request."""
    stored_prefix: list[Message] | None
    """``stored`` when the messages were found to start with it."""
    developer: bool
    """Whether any message has the ``developer`` role."""
    params: SamplingParams
    """Its sampling settings (``default_max_tokens`` when it sets no maximum)."""


def decode_chat(body: bytes, stored: list[Message], max_depth: int,
                state: LastBodies, default_max_tokens: int) -> DecodedChat:
    """Parse and validate a chat body. A body that extends the session's last one is
    parsed and validated only past it (:mod:`tito.server.growing_body`), and its earlier
    messages, the same objects as last time, are neither compared with ``stored`` (the
    session's stored messages) nor scanned again; when its other members are byte for byte
    the last body's, so are its request fields and sampling settings. ``state``: the
    session's API state, where the last body is kept."""
    last: LastBody | None = state.chat_body
    # short: a client that rewrites its last message (a cache marker moved on) still
    # extends the body before it
    parsed = decode_growing(body, "messages", None if last is None else last.parsed,
                            short=True)
    reused = parsed.extended if last is not None else 0
    equal = 0
    if reused and last is not None and last.stored is not None:
        # the reused messages equalled last.stored; still so if the session's stored
        # messages start with the same (they are the same objects unless it rolled back)
        equal = min(reused, len(last.stored), len(stored))
        if stored[:equal] != last.stored[:equal]:
            equal = 0
    chat, verified = validate_chat(parsed.data, stored=stored, max_depth=max_depth,
                                   same_as=last.request if last and parsed.same_rest else None,
                                   equal_prefix=equal, valid_prefix=reused)
    messages = parsed.data["messages"]
    if verified and parsed.state is not None:
        # the client's copies of stored messages (the replies it sends back) give way to
        # the stored objects when they are the same JSON: the state keeps one copy
        for i in range(reused, min(len(messages), len(stored))):
            if messages[i] is not stored[i]:
                share(parsed, i, stored[i])
    developer = (last.developer or has_developer(messages[reused:])) if reused and last \
        else has_developer(messages)
    if last is not None and parsed.same_rest and last.default_max_tokens == default_max_tokens:
        params = last.params
    else:
        params = sampling_params(chat, default_max_tokens=default_max_tokens)
    state.chat_body = LastBody(parsed.state, chat, stored if verified else None,
                                       developer, params, default_max_tokens)
    return DecodedChat(parsed.data, chat, stored if verified else None, developer, params)
