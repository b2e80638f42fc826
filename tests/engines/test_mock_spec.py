"""The mock's speculative-decoding counters (``--speculative-num-draft-tokens``)."""

from __future__ import annotations

import pytest

from tito.engines.mock.replies import spec_counters


def test_the_acceptance_pattern_cycles_per_verify_step() -> None:
    # steps accept 0, 1, 2, 3 drafts: 1 + 2 + 3 + 4 = 10 ids in 4 verify steps
    assert spec_counters(10, 4) == {"spec_verify_ct": 4, "spec_num_correct_drafts": 6,
                                    "spec_num_proposed_drafts": 12}


@pytest.mark.parametrize("generated", [0, 1, 2, 7, 33])
@pytest.mark.parametrize("drafts", [1, 2, 5])
def test_every_id_is_a_verified_draft_or_a_step_token(generated: int, drafts: int) -> None:
    c = spec_counters(generated, drafts)
    assert c["spec_num_correct_drafts"] + c["spec_verify_ct"] == generated
    assert c["spec_num_correct_drafts"] <= c["spec_num_proposed_drafts"] == \
        c["spec_verify_ct"] * (drafts - 1)
