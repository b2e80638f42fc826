"""SGLang's ``/generate`` reply object: ``text``, ``output_ids`` (stop id included) and
``meta_info`` with finish reason, token counts, ``[logprob, id, text|null]`` triples,
top logprobs and the fake MoE routing replay (base64 int32 rows)."""

from __future__ import annotations

import base64
import math
import time
from typing import Any

import numpy as np

from tito.engines.mock.directives import Plan, prompt_digest, token_logprob
from tito.engines.mock.lifecycle import (
    WAITING_ABORT_MESSAGE,
    MockConfig,
    ReqState,
    abort_reason,
)
from tito.types.tokenizer import Tokenizer


class Replies:
    """Builds reply objects; caches the text of single tokens."""

    def __init__(self, config: MockConfig, tokenizer: Tokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self._token_text: dict[int, str] = {}

    def token_text(self, tok: int) -> str:
        text = self._token_text.get(tok)
        if text is None:
            text = self._token_text[tok] = self.tokenizer.decode([tok])
        return text

    def result(self, req: ReqState, weight_version: str, *, final: bool,
               upto: int | None = None) -> dict[str, Any]:
        """The response object (``upto``: a non-final stream chunk of that many tokens)."""
        if req.plan is None:  # aborted in the waiting queue: SGLang's reduced meta_info
            return {"text": "", "output_ids": [], "meta_info": {
                "id": req.rid, "finish_reason": abort_reason(WAITING_ABORT_MESSAGE),
                "weight_version": weight_version,
                "e2e_latency": time.perf_counter() - req.arrived, "completion_tokens": 0}}
        plan = req.plan
        body = req.body
        n = req.emitted if upto is None else upto
        out = plan.output_ids[:n]
        finish = self._finish_reason(req, plan, n) if final else None
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": finish,
            "prompt_tokens": len(req.input_ids),
            "weight_version": weight_version,
            "reasoning_tokens": 0,
            "completion_tokens": n,
            "cached_tokens": req.cached_tokens,
            "num_retractions": req.num_retractions,
        }
        if final:
            meta["e2e_latency"] = time.perf_counter() - req.arrived
            if len(req.versions) > 1:  # SGLang reports spans only when weights changed
                ends = [start for _, start in req.versions[1:]] + [n]
                meta["weight_versions"] = [
                    {"version": v, "start": start, "end": min(end, n)}
                    for (v, start), end in zip(req.versions, ends, strict=True)
                    if start < n]
        if final and self.config.speculative_num_draft_tokens > 0:
            meta.update(spec_counters(n, self.config.speculative_num_draft_tokens))
        if body.get("return_logprob"):
            self._add_logprobs(meta, req, plan, out)
        if final and body.get("return_routed_experts") and \
                self.config.enable_return_routed_experts:
            meta["routed_experts"] = self._routed_experts(
                req.input_ids + out, body.get("routed_experts_start_len") or 0)
        if final and body.get("return_indexer_topk") and \
                self.config.enable_return_indexer_topk:
            cfg = self.config
            rows = indexer_rows(req.input_ids + out, body.get("routed_experts_start_len") or 0,
                                layers=cfg.indexer_layers, topk=cfg.indexer_topk)
            meta["indexer_topk"] = base64.b64encode(rows.astype("<i4").tobytes()).decode()
            meta["indexer_topk_num_layers"] = cfg.indexer_layers
        if final and body.get("return_sampling_mask"):
            sp = req.sampling_params
            meta["output_token_sampling_mask"] = sampling_mask_sets(
                out, len(req.input_ids), vocab=self.tokenizer.vocab_size,
                top_k=_or(sp.get("top_k"), -1), greedy=_or(sp.get("temperature"), 1.0) < 1e-6)
        result: dict[str, Any] = {"text": self._text(req, out, finish), "output_ids": out,
                                  "meta_info": meta}
        if body.get("return_prompt_token_ids"):
            result["prompt_token_ids"] = req.input_ids
        return result

    def chunk(self, req: ReqState, weight_version: str, start: int, upto: int, *,
              incremental: bool) -> dict[str, Any]:
        """A non-final stream chunk after ``upto`` ids: all of them (SGLang's default,
        cumulative) or, ``incremental``, those from ``start`` on. Built in proportion to
        its size: entries and text are made once per id and kept on ``req``."""
        plan = req.plan
        assert plan is not None
        lo = start if incremental else 0
        meta: dict[str, Any] = {
            "id": req.rid, "finish_reason": None, "prompt_tokens": len(req.input_ids),
            "weight_version": weight_version, "num_retractions": req.num_retractions,
        }
        if req.body.get("return_logprob"):
            rows = self._rows(req, plan, upto)[lo:upto]
            meta["output_token_logprobs"] = rows
            meta["output_token_logprobs_length"] = len(rows)
            meta["input_token_logprobs"] = self._input_logprobs(
                req, bool(req.body.get("return_text_in_logprobs")))
            k = req.body.get("top_logprobs_num") or 0
            if k > 0:
                meta["output_top_logprobs"] = [
                    self._top(tok, lp, k, False) for lp, tok, _ in rows]
        meta.update(reasoning_tokens=0, completion_tokens=upto,
                    cached_tokens=req.cached_tokens)
        text = self.tokenizer.decode(plan.output_ids[lo:upto]) if incremental \
            else self._stream_text(req, plan, upto)
        return {"text": text, "output_ids": plan.output_ids[lo:upto], "meta_info": meta}

    def final_chunk(self, req: ReqState, weight_version: str, start: int, *,
                    incremental: bool) -> dict[str, Any]:
        """The last stream chunk: the whole result, or (``incremental``) its ids,
        logprobs and text from ``start`` on with the other fields whole."""
        result = self.result(req, weight_version, final=True)
        if incremental and start:
            meta = result["meta_info"]
            result["output_ids"] = result["output_ids"][start:]
            result["text"] = self.tokenizer.decode(result["output_ids"])
            for key in ("output_token_logprobs", "output_top_logprobs"):
                if key in meta:
                    meta[key] = meta[key][start:]
            if "output_token_logprobs" in meta:
                meta["output_token_logprobs_length"] = len(meta["output_token_logprobs"])
        return result

    def _rows(self, req: ReqState, plan: Plan, upto: int) -> list[list[Any]]:
        rows = req.rows
        with_text = bool(req.body.get("return_text_in_logprobs"))
        for i in range(len(rows), upto):
            tok = plan.output_ids[i]
            rows.append([plan.logprobs[i], tok, self.token_text(tok) if with_text else None])
        return rows

    def _stream_text(self, req: ReqState, plan: Plan, upto: int) -> str:
        """The text of ids ``[0, upto)``, decoded piece by piece as chunks go out."""
        if upto > req.text_upto:
            req.text += self.tokenizer.decode(plan.output_ids[req.text_upto:upto])
            req.text_upto = upto
        return req.text

    @staticmethod
    def _finish_reason(req: ReqState, plan: Plan, n: int) -> dict[str, Any]:
        complete = n == len(plan.output_ids) and not req.aborted
        return plan.finish_reason if complete else abort_reason()

    def _text(self, req: ReqState, out: list[int], finish: dict[str, Any] | None) -> str:
        """Decoded output; the matched stop is trimmed unless ``no_stop_trim``."""
        sp = req.sampling_params
        skip_special = sp.get("skip_special_tokens")
        skip_special = True if skip_special is None else skip_special
        no_trim = bool(sp.get("no_stop_trim"))
        text_ids = out
        matched = finish.get("matched") if finish and finish["type"] == "stop" else None
        if isinstance(matched, int) and not no_trim:
            text_ids = out[:-1]
        text = self.tokenizer.decode(text_ids, skip_special_tokens=skip_special)
        if isinstance(matched, str) and not no_trim:
            cut = text.find(matched)
            if cut >= 0:
                text = text[:cut]
        return text

    def _add_logprobs(self, meta: dict[str, Any], req: ReqState, plan: Plan,
                      out: list[int]) -> None:
        body = req.body
        n = len(out)
        with_text = bool(body.get("return_text_in_logprobs"))
        meta["output_token_logprobs"] = [
            [lp, tok, self.token_text(tok) if with_text else None]
            for lp, tok in zip(plan.logprobs[:n], out, strict=True)
        ]
        meta["output_token_logprobs_length"] = n
        meta["input_token_logprobs"] = self._input_logprobs(req, with_text)
        k = body.get("top_logprobs_num") or 0
        if k > 0:
            meta["output_top_logprobs"] = [
                self._top(tok, lp, k, with_text)
                for lp, tok in zip(plan.logprobs[:n], out, strict=True)
            ]
            meta["input_top_logprobs"] = [
                None if entry[0] is None else self._top(entry[1], entry[0], k, with_text)
                for entry in meta["input_token_logprobs"]
            ]

    def _input_logprobs(self, req: ReqState, with_text: bool) -> list[list[Any]]:
        start = req.body.get("logprob_start_len")
        if start is None or start < 0:
            return []
        digest = prompt_digest(req.input_ids)
        rows: list[list[Any]] = []
        for pos in range(start, len(req.input_ids)):
            tok = req.input_ids[pos]
            lp = None if pos == start else token_logprob(digest, pos, salt=b"in")
            rows.append([lp, tok, self.token_text(tok) if with_text else None])
        return rows

    def _top(self, tok: int, lp: float, k: int, with_text: bool) -> list[list[Any]]:
        """``k`` alternatives: the chosen token and others sharing the remaining mass."""
        vocab = self.tokenizer.vocab_size
        rest = max(1e-9, 1.0 - math.exp(lp))
        rows = [(lp, tok)]
        for j in range(1, k):
            rows.append((math.log(rest * 0.5**j), (tok + 7919 * j) % vocab))
        rows.sort(key=lambda r: -r[0])
        return [[v, t, self.token_text(t) if with_text else None] for v, t in rows]

    def _routed_experts(self, seq: list[int], start: int) -> str:
        """base64 of little-endian int32, shape (len(seq) - 1 - start, layers, topk)."""
        cfg = self.config
        rows = routing_rows(seq, start, layers=cfg.num_layers, topk=cfg.topk,
                            experts=cfg.num_experts)
        return base64.b64encode(rows.astype("<i4").tobytes()).decode("ascii")


def routing_rows(seq: list[int], start: int, *, layers: int, topk: int,
                 experts: int) -> np.ndarray:
    """The mock's deterministic MoE routing: rows ``[start, len(seq) - 1)``, each a
    function of (token, position, layer) only — so the rows of any prefix are the same
    whether computed per turn or in one prefill (the "prefill oracle" of the tests)."""
    end = max(start, len(seq) - 1)
    toks = np.asarray(seq[start:end], dtype=np.uint64)
    pos = np.arange(start, end, dtype=np.uint64)
    h = (toks * np.uint64(2654435761) + pos * np.uint64(40503)) & np.uint64(0xFFFFFFFF)
    salts = np.arange(layers, dtype=np.uint64) * np.uint64(0x9E3779B1)
    mixed = ((h[:, None] ^ salts[None, :]) * np.uint64(2246822519)) >> np.uint64(13)
    base = mixed % np.uint64(experts)
    out = (base[:, :, None] + np.arange(topk, dtype=np.uint64)) % np.uint64(experts)
    return out.astype(np.int32)


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def sampling_mask_sets(output: list[int], prompt_len: int, *, vocab: int, top_k: int,
                       greedy: bool = False) -> list[list[int]]:
    """The mock's deterministic kept sets (the oracle of the tests): output id ``tok`` at
    absolute position ``p`` kept ``tok`` first, then ``(tok + 7919 j) % vocab`` for
    ``j = 1 .. size - 1``, ``size = 1 + (tok * 31 + p) % 4`` (at most ``top_k`` when
    finite; 1 when greedy) — a function of (token, position) only, so the sets of a
    retried or rebuilt turn are the same whenever its ids are."""
    cap = 1 if greedy else top_k if 0 < top_k < 1 << 30 else 4
    sets = []
    for i, tok in enumerate(output):
        size = min(cap, 1 + (tok * 31 + prompt_len + i) % 4)
        sets.append([tok] + [(tok + 7919 * j) % vocab for j in range(1, size)])
    return sets


def indexer_rows(seq: list[int], start: int, *, layers: int, topk: int) -> np.ndarray:
    """The mock's deterministic indexer top-k: for each position p in ``[start,
    len(seq) - 1)`` and layer, ``topk`` earlier positions (in ``[0, p]``) chosen from
    (token, position, layer) only — so per-turn rows equal a one-shot prefill's."""
    end = max(start, len(seq) - 1)
    toks = np.asarray(seq[start:end], dtype=np.uint64)
    pos = np.arange(start, end, dtype=np.uint64)
    h = (toks * np.uint64(40503) + pos * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)
    salts = (np.arange(layers, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x85EBCA6B)
    mixed = (h[:, None] ^ salts[None, :]) * np.uint64(2246822519)
    picks = (mixed[:, :, None] >> (np.arange(topk, dtype=np.uint64) * np.uint64(7)
                                   + np.uint64(5))) % (pos[:, None, None] + np.uint64(1))
    return picks.astype(np.int32)


def spec_counters(generated: int, draft_tokens: int) -> dict[str, int]:
    """SGLang's speculative-decoding counters of a request that generated ``generated``
    ids with ``draft_tokens`` per verify step: step ``k`` proposes ``draft_tokens - 1``
    drafts and accepts ``k % draft_tokens`` of them (never past the output), then adds
    its own token; so ``spec_num_correct_drafts = generated - spec_verify_ct``."""
    proposed_per_step = max(draft_tokens - 1, 0)
    steps = emitted = correct = 0
    while emitted < generated:
        accepted = min(steps % draft_tokens, proposed_per_step, generated - emitted - 1)
        emitted += accepted + 1
        correct += accepted
        steps += 1
    return {"spec_verify_ct": steps, "spec_num_correct_drafts": correct,
            "spec_num_proposed_drafts": steps * proposed_per_step}
