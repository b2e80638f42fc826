"""Routing replay payloads (design §8): the rows an MoE engine reports for every position
it fed to the model, turned into int32 ``(rows, layers, top_k)`` arrays.

SGLang sends raw little-endian int32 bytes (base64 on the wire), rows
``[start_len, len(prompt) + len(output) - 1)``: the last output token is never fed. The
layer count comes from the model (``--routing-layers`` or ``num_hidden_layers`` of the
model's ``config.json``), ``top_k`` is inferred from the length and checked against the
model's ``num_experts_per_tok`` when known.
"""

from __future__ import annotations

import numpy as np

from tito.types.engine import SamplingMask
from tito.types.errors import EngineError

ROWS_DTYPE = np.dtype("<i4")


def decode_rows(payload: bytes | None, *, rows: int, layers: int, top_k: int | None,
                field: str) -> np.ndarray | None:
    """``payload`` as an int32 ``(rows, layers, top_k)`` array (a zero-copy view of the
    bytes); None when the engine sent none. A payload that does not fit the shape is an
    ``engine_protocol_error`` naming ``field`` and the sizes."""
    if payload is None:
        return None
    values, extra = divmod(len(payload), ROWS_DTYPE.itemsize)
    if extra:
        raise _bad(f"meta_info.{field} has {len(payload)} bytes, not a whole number of int32")
    per_row = rows * layers
    if per_row == 0:
        if values:
            raise _bad(f"meta_info.{field} has {values} values for 0 rows")
        return np.zeros((0, layers, top_k or 1), dtype=np.int32)
    k, left = divmod(values, per_row)
    if left or k == 0:
        raise _bad(f"meta_info.{field} has {values} int32 values, not {rows} rows x "
                   f"{layers} layers x top_k")
    if top_k is not None and k != top_k:
        raise _bad(f"meta_info.{field} has top_k {k} per layer, the model routes to "
                   f"{top_k} experts per token")
    arr = np.frombuffer(payload, dtype=ROWS_DTYPE).reshape(rows, layers, k)
    if arr.size and int(arr.min()) < 0:
        raise _bad(f"meta_info.{field} has a negative expert id")
    return arr.astype(np.int32, copy=False)


def check_sampling_mask(mask: SamplingMask | None, output_ids: np.ndarray) -> SamplingMask:
    """``mask`` of a turn whose output is ``output_ids``: one kept set per output id, each
    holding the id that was sampled from it. Missing or inconsistent: an
    ``engine_protocol_error`` (sampling-mask replay is on, so the engine must send it)."""
    if mask is None:
        raise _bad("the engine sent no meta_info.output_token_sampling_mask; sampling-mask "
                   "replay needs an engine that honours return_sampling_mask")
    if mask.positions != len(output_ids):
        raise _bad(f"meta_info.output_token_sampling_mask has {mask.positions} kept sets "
                   f"for {len(output_ids)} output ids")
    if len(output_ids):
        counts = np.diff(mask.offsets)
        if int(counts.min()) < 1:
            raise _bad(f"meta_info.output_token_sampling_mask[{int(np.argmin(counts))}] is "
                       "empty, but the sampled id was drawn from it")
        owner = np.repeat(np.arange(len(output_ids)), counts)
        hits = np.zeros(len(output_ids), dtype=bool)
        hits[owner[mask.ids == np.asarray(output_ids)[owner]]] = True
        if not hits.all():
            i = int(np.argmin(hits))
            raise _bad(f"meta_info.output_token_sampling_mask[{i}] does not hold output id "
                       f"{int(output_ids[i])}, the id sampled from it")
    return mask


def _bad(message: str) -> EngineError:
    return EngineError(message, code="engine_protocol_error")
