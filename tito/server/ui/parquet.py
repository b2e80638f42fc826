"""The viewer's source on a ``samples.parquet`` written by ``tito rollout`` (read-only).

Each row is one sample; the viewer's "sessions" are the rows. A row's strip is rebuilt
from its columns (:func:`tito.server.ui.strip.from_sample`): the prompt, then the
generated spans (``metadata.leaf.completion_spans`` for v2 leaves, else the runs of
``loss_mask`` 1) with the bridge ids between them. Token text needs the tokenizer the
rollout used; without one the strip shows ids.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from tito.samples.sample import STATUSES, Sample
from tito.server.ui.model import ModelCache, SessionModel
from tito.server.ui.strip import Texts, from_sample
from tito.server.ui.views import preview_json
from tito.types.errors import BadRequest, ConfigError, NotFound

T = TypeVar("T")
REQUIRED = ("tokens", "loss_mask", "rollout_log_probs", "prompt_length", "status")


class ParquetSource:
    kind = "file"

    def __init__(self, path: Path, *, texts: Texts | None = None,
                 tokenizer: str | None = None) -> None:
        import pyarrow.parquet as pq

        try:
            self.table = pq.read_table(path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {path} as Parquet: {exc}") from exc
        missing = [c for c in REQUIRED if c not in self.table.column_names]
        if missing:
            raise ConfigError(f"{path} is not a samples file of `tito rollout` (no column "
                              f"{', '.join(missing)})")
        self.path = path
        self.texts = texts
        self.tokenizer = tokenizer
        self.cache = ModelCache()
        self._items: list[dict[str, Any]] | None = None

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": str(self.path), "rows": len(self),
                "has_text": self.texts is not None, "tokenizer": self.tokenizer}

    def sessions(self) -> list[dict[str, Any]]:
        """One entry per row, in file order."""
        if self._items is None:
            self._items = [self._item(i) for i in range(len(self))]
        return self._items

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def model(self, session_id: str, context: str | None = None) -> SessionModel:
        if context is not None:
            raise BadRequest("context is only meaningful for a gateway's live sessions (a "
                             "file's rows are samples)")
        row = self._row_index(session_id)
        model = self.cache.get(session_id, row)
        if model is None:
            model = await self.run(self._model, row)
            self.cache.put(session_id, row, model)
        return model

    # -- rows ------------------------------------------------------------------------------
    def _row_index(self, session_id: str) -> int:
        if not session_id.isdigit() or int(session_id) >= len(self):
            raise NotFound(f"session not found: no sample {session_id!r} in {self.path.name} "
                           f"({len(self)} rows)", code="session_not_found")
        return int(session_id)

    def _value(self, column: str, row: int) -> Any:
        if column not in self.table.column_names:
            return None
        return self.table.column(column)[row].as_py()

    def _array(self, column: str, row: int, dtype: type) -> np.ndarray | None:
        scalar = self.table.column(column)[row]
        values = scalar.values
        return None if values is None else np.asarray(values.to_numpy(zero_copy_only=False),
                                                      dtype=dtype)

    def _metadata(self, row: int) -> dict[str, Any]:
        raw = self._value("metadata", row)
        try:
            meta = json.loads(raw) if isinstance(raw, str) else {}
        except ValueError:
            meta = {}
        return meta if isinstance(meta, dict) else {}

    def _item(self, row: int) -> dict[str, Any]:
        meta = self._metadata(row)
        lifecycle = meta.get("lifecycle")
        tokens = self.table.column("tokens")[row].values
        prompt, sample = self._value("prompt_index", row), self._value("sample_index", row)
        leaf_path = self._value("leaf_path", row)
        label = f"prompt {prompt} · sample {sample}" if prompt is not None else f"row {row}"
        if leaf_path:
            label += f" · leaf {leaf_path[-1]}"
        return {"id": str(row), "label": label, "version": meta.get("session_version"),
                "turns": len(lifecycle) if isinstance(lifecycle, list) else None,
                "tokens": 0 if tokens is None else len(tokens),
                "status": self._value("status", row), "reward": self._value("reward", row),
                "rollout_id": self._value("rollout_id", row), "leaf_path": leaf_path}

    def _sample(self, row: int) -> Sample:
        tokens = self._array("tokens", row, np.int64)
        assert tokens is not None
        prompt_length = int(self._value("prompt_length", row))
        status = str(self._value("status", row))
        reward = self._value("reward", row)
        return Sample(tokens=tokens, response_length=len(tokens) - prompt_length,
                      loss_mask=self._array("loss_mask", row, np.uint8),
                      rollout_log_probs=self._array("rollout_log_probs", row, np.float64),
                      status=status if status in STATUSES else "failed",  # type: ignore[arg-type]
                      metadata=self._metadata(row),
                      reward=None if reward is None else float(reward))

    def _model(self, row: int) -> SessionModel:
        sample = self._sample(row)
        item = self._item(row)
        meta = sample.metadata

        def build(node: int | None) -> Any:
            return from_sample(sample.tokens, sample.prompt_length, sample.loss_mask,
                               sample.rollout_log_probs, sample.status, meta, self.texts)

        return SessionModel(id=str(row), version="file",
                            summary={**item, "num_tokens": len(sample.tokens)},
                            preview=preview_json([sample], None, meta), build=build)
