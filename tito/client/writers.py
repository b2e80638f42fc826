"""Output writers of ``tito rollout``: ``samples.parquet`` and ``summary.json``.

Every file is written to a temporary name in the destination folder and renamed into
place (:func:`atomic_write`), so a failure or Ctrl-C never leaves a partial file, and the
folder itself is only created when there is something to write.

``samples.parquet`` has one row per sample, in (``prompt_index``, ``sample_index``) order
(the samples of one trajectory share both):

=====================  ==================  ============================================
column                 type                meaning
=====================  ==================  ============================================
``prompt_index``       int64               line of the prompt among the prompts
``sample_index``       int64               0 .. ``--n-per-prompt`` - 1
``tokens``             list<int64>         first prompt + everything after it
``loss_mask``          list<uint8>         response region: 1 generated, 0 bridge
``rollout_log_probs``  list<float64>       response region: engine logprob, 0.0 on bridge
``prompt_length``      int64               ``len(tokens) - response_length``
``response_length``    int64               length of the response region
``status``             string              completed / truncated / aborted
``reward``             double (nullable)   the agent's ``reward``
``response``           string              the response region as text
``metadata``           string              JSON: agent + gateway metadata of the sample
``rollout_id``         int64 (nullable)    v2, several samples from one trajectory: its
                                           index among all trajectories (they count
                                           as one rollout); null for a single sample
``leaf_path``          list<int64> (null)  v2: node ids of the sample's root→leaf path
=====================  ==================  ============================================

It loads with ``datasets.load_dataset("parquet", data_files=...)`` or ``pyarrow``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tito.samples import Sample

SAMPLES_FILE = "samples.parquet"
SUMMARY_FILE = "summary.json"
PARQUET_FORMAT_VERSION = "1"


def atomic_write_all(writes: dict[Path, Callable[[Path], None]]) -> None:
    """Write every file to a temporary name next to it, then rename them all into place.

    ``writes`` maps each destination to ``write(tmp)``. Nothing is renamed unless every
    write succeeded, and the temporary files never outlive the call.
    """
    staged: list[tuple[Path, Path]] = []
    try:
        for path, write in writes.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                            dir=path.parent)
            os.close(fd)
            tmp = Path(tmp_name)
            staged.append((tmp, path))
            write(tmp)
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        for tmp, path in staged:
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file next to ``path``, then rename it to ``path``."""
    atomic_write_all({path: write})


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def to_json(data: Any, *, indent: int | None = None) -> str:
    """JSON text of ``data``; numpy values become numbers, anything else its ``str``."""
    return json.dumps(data, default=_json_default, ensure_ascii=False, indent=indent)


def _list_array(arrays: Sequence[np.ndarray | None], dtype: np.dtype[Any], pa_type: Any) -> Any:
    """A pyarrow ``list<pa_type>`` array built from numpy arrays without Python loops per item."""
    import pyarrow as pa

    lengths = np.array([0 if a is None else len(a) for a in arrays], dtype=np.int64)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32 if lengths.sum() < 2**31 else np.int64)
    np.cumsum(lengths, out=offsets[1:])
    parts = [np.asarray(a, dtype=dtype) for a in arrays if a is not None and len(a)]
    values = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    nulls = [a is None for a in arrays]
    mask = pa.array(nulls, type=pa.bool_()) if any(nulls) else None
    array_cls = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
    return array_cls.from_arrays(pa.array(offsets), pa.array(values, type=pa_type), mask=mask)


def samples_table(rows: Sequence[tuple[int, int, Sample]]) -> Any:
    """A pyarrow Table of ``(prompt_index, sample_index, sample)`` rows (module docstring)."""
    import pyarrow as pa

    samples = [s for _, _, s in rows]
    columns = {
        "prompt_index": pa.array([p for p, _, _ in rows], type=pa.int64()),
        "sample_index": pa.array([k for _, k, _ in rows], type=pa.int64()),
        "tokens": _list_array([s.tokens for s in samples], np.dtype(np.int64), pa.int64()),
        "loss_mask": _list_array([s.loss_mask for s in samples], np.dtype(np.uint8),
                                 pa.uint8()),
        "rollout_log_probs": _list_array([s.rollout_log_probs for s in samples],
                                         np.dtype(np.float64), pa.float64()),
        "prompt_length": pa.array([s.prompt_length for s in samples], type=pa.int64()),
        "response_length": pa.array([s.response_length for s in samples], type=pa.int64()),
        "status": pa.array([s.status for s in samples], type=pa.string()),
        "reward": pa.array([None if s.reward is None else float(s.reward) for s in samples],
                           type=pa.float64()),
        "response": pa.array([s.response for s in samples], type=pa.string()),
        "metadata": pa.array([to_json(s.metadata) for s in samples], type=pa.string()),
        "rollout_id": pa.array([s.rollout_id for s in samples],
                               type=pa.int64() if all(r is None or isinstance(r, int)
                                                      for r in (s.rollout_id for s in samples))
                               else pa.string()),
        "leaf_path": pa.array([_leaf_path(s) for s in samples], type=pa.list_(pa.int64())),
    }
    table = pa.table(columns)
    return table.replace_schema_metadata({"tito_samples_format": PARQUET_FORMAT_VERSION})


def _leaf_path(sample: Sample) -> list[int] | None:
    leaf = sample.metadata.get("leaf")
    return [int(i) for i in leaf["path_node_ids"]] if isinstance(leaf, dict) else None


def parquet_writer(rows: Sequence[tuple[int, int, Sample]]) -> Callable[[Path], None]:
    """``write(path)`` for :func:`atomic_write`: the samples table as zstd Parquet."""
    import pyarrow.parquet as pq

    table = samples_table(rows)
    return lambda path: pq.write_table(table, path, compression="zstd")


def json_writer(data: Any) -> Callable[[Path], None]:
    """``write(path)`` for :func:`atomic_write`: ``data`` as indented JSON."""
    text = to_json(data, indent=2) + "\n"

    def write(path: Path) -> None:
        path.write_text(text, encoding="utf-8")

    return write


def write_samples_parquet(path: Path, rows: Sequence[tuple[int, int, Sample]]) -> None:
    """Write ``rows`` to ``path`` (atomically)."""
    atomic_write(path, parquet_writer(rows))


def write_rollout(out_dir: Path, rows: Sequence[tuple[int, int, Sample]],
                  summary: dict[str, Any]) -> dict[str, Path]:
    """``samples.parquet`` and ``summary.json`` into ``out_dir``, both or neither."""
    samples_path, summary_path = out_dir / SAMPLES_FILE, out_dir / SUMMARY_FILE
    atomic_write_all({samples_path: parquet_writer(rows), summary_path: json_writer(summary)})
    return {"samples": samples_path, "summary": summary_path}
