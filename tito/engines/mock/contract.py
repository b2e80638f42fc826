"""SGLang's request contract for ``/generate``: the JSON types of the body and of
``sampling_params`` (unknown keys rejected) and the value checks SGLang runs on them.

Two kinds of rejection, with SGLang's two 400 shapes: :class:`ContractError` (the body
does not deserialize: ``{"error": "<text>"}``) and :class:`RequestError` (a ValueError
raised while validating: ``{"error": {"message": ...}}``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import orjson

from tito.types.tokenizer import Tokenizer

SAMPLING_KEYS = (
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "stop", "stop_token_ids",
    "stop_regex", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "n", "sampling_seed", "logit_bias", "json_schema", "regex", "ebnf",
    "structural_tag", "stream_interval", "custom_params",
)
_INT_KEYS = ("max_new_tokens", "min_new_tokens", "top_k", "n", "sampling_seed", "stream_interval")
_FLOAT_KEYS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
               "repetition_penalty")
_BOOL_KEYS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
              "no_stop_trim")
_STR_KEYS = ("json_schema", "regex", "ebnf")
_BODY_BOOL_KEYS = ("return_logprob", "stream", "return_text_in_logprobs",
                   "return_prompt_token_ids", "return_routed_experts", "return_indexer_topk",
                   "return_sampling_mask")
_BODY_INT_KEYS = ("logprob_start_len", "top_logprobs_num", "routed_experts_start_len")
_NO_BATCH = "the mock engine serves one prompt per request (no batch)"


class ContractError(Exception):
    """A request that breaks the JSON contract: ``400 {"error": "<text>"}``."""


class RequestError(Exception):
    """A request SGLang rejects with a ValueError: ``400 {"error": {"message": ...}}``."""


# -- JSON types ----------------------------------------------------------------------------
def type_name(value: Any) -> str:
    """How serde names a JSON value in its "invalid type" messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f"string {orjson.dumps(value).decode()}"
    if isinstance(value, list):
        return "a sequence"
    return "a map"


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_map(v: Any) -> bool:
    return isinstance(v, dict)


def _is_str_or_strs(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(is_int(t) for t in v)


def _anything(v: Any) -> bool:
    return True


def expect(key: str, value: Any, ok: bool, expected: str) -> None:
    if not ok:
        raise ContractError(f"invalid type: {type_name(value)}, expected {expected} "
                            f"(field `{key}`)")


_Rule = tuple[Callable[[Any], bool], str]
_SAMPLING_TYPES: dict[str, _Rule] = {
    **{k: (is_int, "an integer") for k in _INT_KEYS},
    **{k: (_is_number, "a number") for k in _FLOAT_KEYS},
    **{k: (_is_bool, "a boolean") for k in _BOOL_KEYS},
    "stop": (_is_str_or_strs, "a string or a sequence of strings"),
    "stop_regex": (_is_str_or_strs, "a string or a sequence of strings"),
    "stop_token_ids": (_is_int_list, "a sequence of integers"),
    "logit_bias": (_is_map, "a map"),
    "custom_params": (_is_map, "a map"),
    **{k: (_is_str, "a string") for k in _STR_KEYS},
    "structural_tag": (_anything, "a string"),  # a string or an object
}


# -- sampling_params -----------------------------------------------------------------------
def check_sampling_params(sp: Any) -> dict[str, Any]:
    """The JSON contract of ``sampling_params`` (unknown keys rejected) and SGLang's verify()."""
    if sp is None:
        return {}
    if not isinstance(sp, dict):
        raise ContractError(f"invalid type: {type_name(sp)}, expected struct SamplingParams "
                            "(field `sampling_params`)")
    for key in sp:
        if key not in SAMPLING_KEYS:
            expected = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            raise ContractError(f"unknown field `{key}`, expected one of {expected}")
    for key, value in sp.items():
        if value is not None:
            ok, expected = _SAMPLING_TYPES[key]
            expect(key, value, ok(value), expected)
    # SamplingParams.verify(): ValueErrors -> 400 {"error": {"message"}}
    given = {k: v for k, v in sp.items() if v is not None}
    _verify_ranges(given)
    _verify_lengths(given)
    _verify_grammar(given)
    return sp


def _verify_ranges(g: dict[str, Any]) -> None:
    if g.get("temperature", 1.0) < 0.0:
        raise RequestError(f"temperature must be non-negative, got {g['temperature']}.")
    if not 0.0 < g.get("top_p", 1.0) <= 1.0:
        raise RequestError(f"top_p must be in (0, 1], got {g['top_p']}.")
    if not 0.0 <= g.get("min_p", 0.0) <= 1.0:
        raise RequestError(f"min_p must be in [0, 1], got {g['min_p']}.")
    top_k = g.get("top_k", -1)
    if top_k < 1 and top_k != -1:
        raise RequestError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if not -2.0 <= g.get("frequency_penalty", 0.0) <= 2.0:
        raise RequestError("frequency_penalty must be in [-2, 2], got "
                           f"{g['frequency_penalty']}.")
    if not -2.0 <= g.get("presence_penalty", 0.0) <= 2.0:
        raise RequestError(f"presence_penalty must be in [-2, 2], got {g['presence_penalty']}.")
    if not 0.0 < g.get("repetition_penalty", 1.0) <= 2.0:
        raise RequestError("repetition_penalty must be in (0, 2], got "
                           f"{g['repetition_penalty']}.")


def _verify_lengths(g: dict[str, Any]) -> None:
    max_new = g.get("max_new_tokens", 128)
    if max_new < 0:
        raise RequestError(f"max_new_tokens must be at least 0, got {max_new}.")
    min_new = g.get("min_new_tokens", 0)
    if not 0 <= min_new <= max_new:
        raise RequestError(f"min_new_tokens must be in [0, max_new_tokens({max_new})], "
                           f"got {min_new}.")
    if g.get("n", 1) != 1:
        raise RequestError("the mock engine serves one sample per request (n = 1); "
                           "fan out in the client")


def _verify_grammar(g: dict[str, Any]) -> None:
    """One constraint at most (SamplingParams.verify()), and a ``json_schema`` that is JSON.

    SGLang compiles the schema in its scheduler and aborts the request with status 400
    (``Failed to compile json grammar: ...``), which a non-streamed ``/generate`` answers as
    this 400; the mock also answers a streamed one so, before its first chunk. It does not
    constrain what it generates: its replies follow the directives."""
    if sum(g.get(k) is not None for k in ("json_schema", "regex", "ebnf")) > 1:
        raise RequestError("Only one of regex, json_schema, or ebnf can be set.")
    schema = g.get("json_schema")
    if schema is None:
        return
    try:
        parsed = orjson.loads(schema)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"Failed to compile json grammar: {exc}") from None
    if not isinstance(parsed, dict | bool):
        raise RequestError("Failed to compile json grammar: a JSON schema is an object or "
                           "a boolean")


# -- the /generate body ----------------------------------------------------------------------
def check_body(body: Any) -> dict[str, Any]:
    """JSON types of a ``/generate`` body; returns its checked ``sampling_params``."""
    if not isinstance(body, dict):
        raise ContractError(f"invalid type: {type_name(body)}, expected struct GenerateRequest")
    sp = check_sampling_params(body.get("sampling_params"))
    for key in _BODY_BOOL_KEYS:
        value = body.get(key)
        if value is not None:
            expect(key, value, isinstance(value, bool), "a boolean")
    for key in _BODY_INT_KEYS:
        value = body.get(key)
        if value is not None:
            expect(key, value, is_int(value), "an integer")
    return sp


def prompt_ids(body: dict[str, Any], tokenizer: Tokenizer) -> list[int]:
    """The prompt's ids (``input_ids``, or ``text`` encoded), each in the vocabulary."""
    input_ids = body.get("input_ids")
    text = body.get("text")
    if body.get("input_embeds") is not None:
        raise RequestError("the mock engine does not take input_embeds")
    if (input_ids is None) == (text is None):
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    ids = _id_list(input_ids if text is None else _encode_text(text, tokenizer))
    vocab = tokenizer.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(f"The input_ids {bad} >= the vocab_size {vocab}.")
    return ids


def _encode_text(text: Any, tokenizer: Tokenizer) -> list[int]:
    if isinstance(text, list):
        raise RequestError(_NO_BATCH)
    expect("text", text, isinstance(text, str), "a string")
    return tokenizer.encode(text)


def _id_list(input_ids: Any) -> list[int]:
    if not isinstance(input_ids, list) or not all(is_int(t) for t in input_ids):
        if isinstance(input_ids, list) and input_ids and all(
                isinstance(x, list) for x in input_ids):
            raise RequestError(_NO_BATCH)
        expect("input_ids", input_ids, False, "a sequence of integers")
    if not input_ids:
        raise RequestError("input_ids cannot be empty.")
    return input_ids


def request_id(body: dict[str, Any]) -> str:
    """The body's ``rid`` (one string), or a fresh one."""
    rid = body.get("rid")
    if rid is None:
        rid = uuid.uuid4().hex
    elif isinstance(rid, list):
        raise RequestError(_NO_BATCH)
    expect("rid", rid, isinstance(rid, str), "a string")
    return rid


def check_lengths(n_in: int, sp: dict[str, Any], context_length: int) -> None:
    """SGLang's context-length checks of the prompt and prompt + ``max_new_tokens``."""
    ctx = context_length
    if n_in >= ctx:
        raise RequestError(f"The input ({n_in} tokens) is longer than the model's "
                           f"context length ({ctx} tokens).")
    max_new = sp.get("max_new_tokens")
    if max_new is not None and max_new + n_in >= ctx:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {ctx} "
            f"tokens. You requested a total of {max_new + n_in} tokens: {n_in} tokens from "
            f"the input messages and {max_new} tokens for the completion. Please reduce "
            "the number of tokens in the input messages or the completion to fit within "
            "the limit.")


def check_sampling_mask(body: dict[str, Any], sp: dict[str, Any]) -> None:
    """SGLang admits ``return_sampling_mask`` only when sampling truncates: a finite
    ``top_k`` or ``top_p < 1`` (else the kept set is the whole vocabulary); greedy
    sampling is ``top_k`` 1 inside SGLang."""
    if not body.get("return_sampling_mask"):
        return
    top_k = -1 if sp.get("top_k") is None else sp["top_k"]
    top_p = 1.0 if sp.get("top_p") is None else sp["top_p"]
    greedy = sp.get("temperature") is not None and sp["temperature"] < 1e-6  # top_k 1
    if not (0 < top_k < 1 << 30) and not top_p < 1.0 and not greedy:
        raise RequestError("return_sampling_mask requires a finite top_k or top_p < 1")


def check_routed_experts(body: dict[str, Any], n_in: int, *, enabled: bool) -> None:
    """``routed_experts_start_len`` must lie within the prompt (when replay is served)."""
    if body.get("return_routed_experts") and enabled:
        start = body.get("routed_experts_start_len") or 0
        if not 0 <= start <= n_in:
            raise RequestError(f"routed_experts_start_len ({start}) must be in "
                               f"[0, {n_in}] (the prompt length)")
