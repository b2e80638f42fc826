"""The embedded model's split output head (random weights, no model is loaded)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tito.engines.embedded_head import (  # noqa: E402
    BLOCKS,
    SCHED_IDLE,
    SplitHead,
    split_head_available,
)
from tito.engines.embedded_model import onednn_available, onednn_linear  # noqa: E402

pytestmark = pytest.mark.skipif(not onednn_available(), reason="needs oneDNN")


def _pack(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 16)


def test_split_head_gives_the_bits_of_one_matmul() -> None:
    torch.manual_seed(0)
    weight = torch.randn(BLOCKS * 64 * 3, 96)
    head = SplitHead(weight, _pack, onednn_linear)
    whole = _pack(weight)
    try:
        with torch.inference_mode():
            for rows in (1, 3, 8, 40):
                x = torch.randn(rows, 96)
                for _ in range(3):  # whichever blocks the helper happens to take
                    assert torch.equal(head(x), onednn_linear(x, whole))
    finally:
        head.close()
    with torch.inference_mode():  # closed: the calling thread computes every block
        x = torch.randn(8, 96)
        assert torch.equal(head(x), onednn_linear(x, whole))


@pytest.mark.skipif(SCHED_IDLE is None, reason="no idle priority here: no helper thread")
def test_split_head_helper_stops_on_close() -> None:
    head = SplitHead(torch.randn(BLOCKS * 64, 32), _pack, onednn_linear)
    helper = head._thread
    assert helper.name == "tito-embedded-head" and helper.is_alive()
    head.close()
    head.close()  # idempotent
    assert not helper.is_alive()


def test_split_head_only_for_a_single_threaded_model() -> None:
    assert not split_head_available(2)
