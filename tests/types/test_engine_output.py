"""Engine logprobs are stored compactly only when that loses nothing."""

from __future__ import annotations

import numpy as np

from tito.types.engine import GenerateResult, check_output


def test_float32_exact_values_are_stored_as_float32() -> None:
    values = [float(np.float32(-0.1)), -0.5, 0.0]  # what a float32 engine sends
    out = check_output(GenerateResult([1, 2, 3], values, "stop"), vocab_size=10)
    assert out.logprobs.dtype == np.float32
    assert out.logprobs.astype(np.float64).tolist() == values  # widened back exactly


def test_other_values_keep_float64() -> None:
    values = [-0.1, -0.5]  # -0.1 is not a float32 value
    out = check_output(GenerateResult([1, 2], values, "stop"), vocab_size=10)
    assert out.logprobs.dtype == np.float64 and out.logprobs.tolist() == values
