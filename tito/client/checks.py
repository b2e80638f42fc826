"""The TITO checks run on every sample of a rollout.

TITO invariant violations of a sample (each one is a string in the summary):

1. structure (:func:`tito.samples.sample_problem`): ``tokens`` 1-D, ``0 <= response_length
   <= len(tokens)``, ``loss_mask`` and ``rollout_log_probs`` present (unless the response
   is empty) with exactly ``response_length`` entries, a known ``status``;
2. ``loss_mask`` values are 0 or 1;
3. ``rollout_log_probs`` are finite, ``<= 1e-5`` on generated positions (a log
   probability) and exactly ``0.0`` on bridge positions. Generated positions are those
   of ``loss_mask == 1``, or, for a v2 leaf sample, its ``leaf.completion_spans`` (a
   completion another sample trains keeps its logprobs with its mask zeroed), and the
   mask trains nothing else;
4. a sample that is not ``aborted`` has a non-empty response that starts with a generated
   token (the first turn's output directly follows the first prompt);
5. every entry of the gateway's ``tito_session_mismatch`` report whose type is one of the
   strict classes (:data:`tito.types.mismatch.STRICT_TYPES`: ``special_token_count``,
   ``special_token_type``, ``non_assistant_text``): the accumulated ids differ from the
   canonical render of the committed messages outside assistant text.

Class 5 is also counted on its own as *strict mismatches*. ``assistant_text`` entries are
expected (history assistant tokens are the model's own ids) and only reported.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tito.samples import Sample, sample_problem
from tito.types.mismatch import STRICT_TYPES

LOGPROB_TOLERANCE = 1e-5


def strict_mismatches(sample: Sample) -> list[dict[str, Any]]:
    """The strict-class entries of the sample's ``tito_session_mismatch`` report."""
    report = sample.metadata.get("tito_session_mismatch") or []
    return [m for m in report if isinstance(m, dict) and m.get("type") in STRICT_TYPES]


def sample_violations(sample: Sample) -> list[str]:
    """The TITO invariant violations of one sample (module docstring, classes 1-5)."""
    problem = sample_problem(sample)
    if problem is not None:
        return [problem]
    out: list[str] = []
    rl = sample.response_length
    mask, logprobs = sample.loss_mask, sample.rollout_log_probs
    if rl and (mask is None or logprobs is None):
        out.append("loss_mask / rollout_log_probs missing for a non-empty response")
    if mask is not None and logprobs is not None and rl:
        out.extend(_training_field_problems(sample, np.asarray(mask).astype(np.int64),
                                            np.asarray(logprobs, dtype=np.float64)))
    if sample.status != "aborted" and rl == 0:
        out.append(f"{sample.status} sample with an empty response")
    out.extend(f"strict mismatch {m.get('type')}: {m.get('detail', '')}"
               for m in strict_mismatches(sample))
    return out


def _generated_positions(sample: Sample, mask: np.ndarray) -> np.ndarray:
    """Which response positions hold generated ids (bool, ``response_length`` entries)."""
    leaf = sample.metadata.get("leaf")
    if not isinstance(leaf, dict) or not isinstance(leaf.get("completion_spans"), list):
        return mask != 0
    generated = np.zeros(sample.response_length, dtype=bool)
    prompt = sample.prompt_length
    for _node, start, end in leaf["completion_spans"]:
        generated[max(start - prompt, 0) : max(end - prompt, 0)] = True
    return generated


def _training_field_problems(sample: Sample, mask: np.ndarray, lp: np.ndarray) -> list[str]:
    out: list[str] = []
    if not np.isin(mask, (0, 1)).all():
        out.append("loss_mask has values other than 0 and 1")
    generated = _generated_positions(sample, mask)
    if (mask.astype(bool) & ~generated).any():
        out.append("loss_mask trains a position that was not generated")
    if not np.isfinite(lp).all():
        out.append("rollout_log_probs has non-finite values")
    elif (lp[generated] > LOGPROB_TOLERANCE).any():
        out.append("rollout_log_probs has positive values on generated tokens")
    if (lp[~generated] != 0.0).any():
        out.append("rollout_log_probs is not 0.0 on bridge tokens")
    if sample.status != "aborted" and not generated[0]:
        out.append("the response does not start with a generated token")
    return out
