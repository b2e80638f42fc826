"""Routing/indexer payloads become int32 (rows, layers, top_k) views, or a 502 naming the
field; the row shape comes from the flags or the model's config.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tito.config import ServerConfig
from tito.engines.sglang_reply import parse_generate_response
from tito.server.routing_replay import routing_shape
from tito.types.errors import ConfigError, EngineError
from tito.types.replay import check_sampling_mask, decode_rows


def payload(*shape: int) -> bytes:
    return np.arange(int(np.prod(shape)), dtype="<i4").tobytes()


def test_rows_are_decoded_and_top_k_inferred() -> None:
    rows = decode_rows(payload(5, 3, 2), rows=5, layers=3, top_k=None, field="routed_experts")
    assert rows is not None and rows.shape == (5, 3, 2) and rows.dtype == np.int32
    assert decode_rows(None, rows=5, layers=3, top_k=2, field="routed_experts") is None
    empty = decode_rows(b"", rows=0, layers=3, top_k=2, field="routed_experts")
    assert empty is not None and empty.shape == (0, 3, 2)


@pytest.mark.parametrize(("data", "top_k", "message"), [
    (payload(5, 3, 2)[:-1], None, "not a whole number of int32"),
    (payload(4, 3, 2), None, "not 5 rows x 3 layers x top_k"),
    (payload(5, 3, 2), 4, "top_k 2 per layer, the model routes to 4"),
    (np.full((5, 3, 2), -1, "<i4").tobytes(), None, "negative expert id"),
])
def test_bad_payloads_are_protocol_errors(data: bytes, top_k: int | None,
                                          message: str) -> None:
    with pytest.raises(EngineError) as err:
        decode_rows(data, rows=5, layers=3, top_k=top_k, field="routed_experts")
    assert err.value.code == "engine_protocol_error"
    assert "meta_info.routed_experts" in err.value.message and message in err.value.message


def test_shape_from_flags_or_config_json(tmp_path: Path) -> None:
    base = {"tokenizer": str(tmp_path), "engine": "sglang", "engine_url": "http://x",
            "routing_replay": True}
    with pytest.raises(ConfigError, match="--routing-layers N"):
        routing_shape(ServerConfig(**base))
    assert routing_shape(ServerConfig(**base, routing_layers=7)) == (7, None)
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 48, "num_experts_per_tok": 8}')
    assert routing_shape(ServerConfig(**base)) == (48, 8)
    assert routing_shape(ServerConfig(**{**base, "routing_replay": False})) == (None, None)


# -- sampling masks (SGLang meta_info.output_token_sampling_mask) ------------------------
def sglang_reply(sets: object, output: list[int]) -> dict[str, object]:
    return {"output_ids": output, "meta_info": {
        "finish_reason": {"type": "length", "length": len(output)},
        "output_token_logprobs": [[-0.5, tok, None] for tok in output],
        "output_token_sampling_mask": sets}}


def test_sampling_mask_is_parsed_and_checked_against_the_output() -> None:
    result = parse_generate_response(sglang_reply([[5, 9], [7], []], [5, 7]), rid="r",
                                     vocab_size=100)
    mask = result.sampling_mask
    assert mask is not None and mask.ids.tolist() == [5, 9, 7]
    assert mask.offsets.tolist() == [0, 2, 3, 3] and mask.offsets.dtype == np.int64
    with pytest.raises(EngineError, match="3 kept sets for 2 output ids"):
        check_sampling_mask(mask, np.array([5, 7]))
    good = parse_generate_response(sglang_reply([[9, 5], [7]], [5, 7]), rid="r").sampling_mask
    assert check_sampling_mask(good, np.array([5, 7])) is good
    with pytest.raises(EngineError, match=r"\[1\] does not hold output id 8"):
        check_sampling_mask(good, np.array([5, 8]))
    with pytest.raises(EngineError, match="honours return_sampling_mask"):
        check_sampling_mask(None, np.array([5]))


@pytest.mark.parametrize(("sets", "message"), [
    ("abc", "not a list of token id lists"),
    ([[5], 7], "not a list of token id lists"),
    ([[5], [-1]], r"\[1\] holds -1"),
    ([[5], [100]], r"\[1\] holds 100"),
    ([[5], [True]], r"\[1\] holds True"),
])
def test_malformed_sampling_masks_are_protocol_errors(sets: object, message: str) -> None:
    with pytest.raises(EngineError, match=message) as info:
        parse_generate_response(sglang_reply(sets, [5, 7]), rid="r", vocab_size=100)
    assert info.value.code == "engine_protocol_error"
