"""Engine output checks: logprobs are stored compactly only when that loses nothing; a
``stop`` with no output ids is refused."""

from __future__ import annotations

import numpy as np
import pytest

from tito.types.engine import FinishReason, GenerateResult, check_output
from tito.types.errors import EngineError


def test_float32_exact_values_are_stored_as_float32() -> None:
    values = [float(np.float32(-0.1)), -0.5, 0.0]  # what a float32 engine sends
    out = check_output(GenerateResult([1, 2, 3], values, "stop"), vocab_size=10)
    assert out.logprobs.dtype == np.float32
    assert out.logprobs.astype(np.float64).tolist() == values  # widened back exactly


def test_other_values_keep_float64() -> None:
    values = [-0.1, -0.5]  # -0.1 is not a float32 value
    out = check_output(GenerateResult([1, 2], values, "stop"), vocab_size=10)
    assert out.logprobs.dtype == np.float64 and out.logprobs.tolist() == values


def test_a_stop_with_no_output_ids_is_a_protocol_error() -> None:
    with pytest.raises(EngineError) as info:
        check_output(GenerateResult([], [], "stop", matched_stop=2), vocab_size=10)
    assert info.value.code == "engine_protocol_error"
    assert "stop with no output ids" in str(info.value)


@pytest.mark.parametrize("finish", ["length", "abort"])
def test_other_finishes_may_have_no_output_ids(finish: FinishReason) -> None:
    out = check_output(GenerateResult([], [], finish), vocab_size=10)
    assert len(out.ids) == 0 and len(out.logprobs) == 0


def test_a_parsed_reply_is_checked_against_the_gateway_vocabulary() -> None:
    """A reply the client parsed without a vocabulary (its arrays already built) is still
    refused when an id is past the gateway's, naming it; within it, the arrays are kept."""
    from tito.engines.sglang_reply import parse_generate_response

    def parsed(ids: list[int]) -> GenerateResult:
        return parse_generate_response({"output_ids": ids, "meta_info": {
            "finish_reason": {"type": "stop"},
            "output_token_logprobs": [[-0.5, i, None] for i in ids]}}, rid="r")

    result = parsed([3, 12, 4])
    with pytest.raises(EngineError, match=r"output_ids\[1\] = 12 is outside the vocab"):
        check_output(result, vocab_size=10)
    result = parsed([3, 9, 4])
    assert check_output(result, vocab_size=10) is result.checked
