"""The prompt set of a rollout: ``--data``, a JSONL file of one ``{"messages": [...],
"metadata": {...}}`` per line. :func:`load_prompts` raises :class:`RolloutInputError` with
the line number of the first bad line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tito.client.errors import RolloutInputError


@dataclass(frozen=True, slots=True)
class PromptItem:
    """One line of the data file."""

    index: int
    """0-based position among the prompts (the ``prompt_index`` of its samples)."""
    messages: list[dict[str, Any]]
    metadata: dict[str, Any]
    line: int
    """1-based line number in the file."""


def _check_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise RolloutInputError(f"{where}: 'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RolloutInputError(f"{where}: messages[{i}] must be an object with a 'role'")
    return messages


def load_prompts(path: str | Path, *, limit: int | None = None) -> list[PromptItem]:
    """The prompts of a JSONL file (blank lines skipped), the first ``limit`` if given.

    Every line is validated, also past ``limit``: a bad file fails before any work.
    """
    path = Path(path)
    if not path.is_file():
        raise RolloutInputError(f"--data {str(path)!r}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RolloutInputError(f"--data {str(path)!r}: cannot read: {exc}") from None
    items: list[PromptItem] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RolloutInputError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})"
                                    ) from None
        if not isinstance(record, dict):
            raise RolloutInputError(f"{where}: expected a JSON object, got "
                                    f"{type(record).__name__}")
        if "messages" not in record:
            raise RolloutInputError(f"{where}: missing 'messages'")
        messages = _check_messages(record["messages"], where)
        metadata = record.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise RolloutInputError(f"{where}: 'metadata' must be an object")
        items.append(PromptItem(len(items), messages, metadata, number))
    if not items:
        raise RolloutInputError(f"--data {str(path)!r}: no prompts in the file")
    return items[:limit] if limit is not None else items
