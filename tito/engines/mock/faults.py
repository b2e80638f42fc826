"""Fault injection: real failures over HTTP, so clients can be tested against them.

A fault is ``MODE[:ARG]``. It reaches a ``/generate`` request in two ways: every request
gets the faults of ``tito mock-engine --fault`` (:attr:`MockConfig.faults`), and one
request gets those of its ``FAULT <mode> [<arg>]`` directive lines (in the last user or
tool message, like the other directives; ``FAULT <mode>:<arg>`` works too, an unknown mode
or a bad argument makes the line ignored). Faults apply after the request was admitted
(invalid requests still get SGLang's 400) and logged; how they apply to a streamed
request: :mod:`tito.engines.mock.streaming`.

Modes (the rest of the reply stays SGLang's wire format):

- ``reset``: the connection is reset (RST) without a byte of response;
  ``reset:partial``: status line, headers and half the body are sent, then the connection
  is closed (the response started);
- ``malformed_json``: 200 with the JSON body cut in half;
- ``wrong_types``: ``meta_info`` is a list;
- ``bad_ids``: the first output id (and its logprob entry) is ``-1``;
  ``bad_ids:vocab``: it is the vocabulary size (one past the last id);
  ``bad_ids:int32``: it is 2**31 (past the largest int32);
- ``bad_logprob[:X]``: the first output logprob is X (default ``1e300``; ``nan`` and
  ``inf`` go out as ``null``, as SGLang's orjson writes them);
- ``empty``: no output ids (nor logprob entries), the finish reason kept (a ``stop``
  with nothing generated: a real engine always sends the stop token);
- ``http_500[:STATUS]``: HTTP 500 (or STATUS, 500-599) with the body SGLang's FastAPI
  server gives an aborted request, ``{"detail": "<message>"}``;
- ``slow[:S]``: sleep S seconds (default 1) before answering; a client that goes away
  meanwhile aborts the request.

Several faults combine: the ``slow`` delays add up, ``empty``, ``bad_ids``,
``bad_logprob`` and ``wrong_types`` all apply (in that order), and of ``reset``,
``http_500``, ``malformed_json`` the first in that order decides how the reply goes out
(:mod:`tito.engines.mock.faulty`).

This module is pure (parsing, the result-object changes); no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

FAULT_MODES = ("reset", "malformed_json", "wrong_types", "bad_ids", "bad_logprob",
               "http_500", "slow", "empty")
TERMINAL_MODES = ("reset", "http_500", "malformed_json")
BAD_IDS = {"negative": -1, "int32": 2**31}
"""The id ``bad_ids:ARG`` puts first (``vocab``: the vocabulary size)."""
"""Modes that decide how the reply goes out, by precedence."""


@dataclass(frozen=True)
class Fault:
    mode: str
    arg: str | None = None

    @property
    def spec(self) -> str:
        return self.mode if self.arg is None else f"{self.mode}:{self.arg}"

    @property
    def seconds(self) -> float:
        return float(self.arg) if self.arg is not None else 1.0

    @property
    def status(self) -> int:
        return int(self.arg) if self.arg is not None else 500

    @property
    def logprob(self) -> float:
        return float(self.arg) if self.arg is not None else 1e300


def _number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True


def _arg_ok(mode: str, arg: str | None) -> bool:
    if arg is None:
        return True
    if mode == "reset":
        return arg == "partial"
    if mode == "bad_ids":
        return arg in ("negative", "vocab", "int32")
    if mode == "bad_logprob":
        return _number(arg)
    if mode == "http_500":
        return arg.isdigit() and 500 <= int(arg) <= 599
    if mode == "slow":
        return _number(arg) and 0.0 <= float(arg) < math.inf
    return False  # malformed_json, wrong_types, empty take no argument


def parse_fault(spec: str) -> Fault:
    """``MODE``, ``MODE:ARG`` or ``MODE ARG``; ValueError when it is not a fault."""
    text = spec.strip()
    sep = ":" if ":" in text else " "
    mode, _, arg = text.partition(sep)
    mode, arg = mode.strip(), arg.strip()
    if mode not in FAULT_MODES:
        raise ValueError(f"unknown fault {mode!r} (one of {', '.join(FAULT_MODES)})")
    if not _arg_ok(mode, arg or None):
        raise ValueError(f"bad argument {arg!r} for fault {mode}")
    return Fault(mode, arg or None)


def fault_delay(faults: Iterable[Fault]) -> float:
    return sum(f.seconds for f in faults if f.mode == "slow")


def terminal_fault(faults: Sequence[Fault]) -> Fault | None:
    for mode in TERMINAL_MODES:
        for fault in faults:
            if fault.mode == mode:
                return fault
    return None


# -- reply corruption ------------------------------------------------------------------
def _bad_id(result: dict[str, Any], tok: int) -> None:
    out = result["output_ids"]
    meta = result["meta_info"]
    rows = meta.get("output_token_logprobs")
    if out:
        out[0] = tok
        if rows:
            rows[0][1] = tok
        return
    out.append(tok)
    meta["completion_tokens"] = len(out)
    if isinstance(rows, list):
        rows.append([-1.0, tok, None])
        meta["output_token_logprobs_length"] = len(rows)


def _empty(result: dict[str, Any]) -> None:
    meta = result["meta_info"]
    result["output_ids"] = []
    result["text"] = ""
    meta["completion_tokens"] = 0
    if isinstance(meta.get("output_token_logprobs"), list):
        meta["output_token_logprobs"] = []
        meta["output_token_logprobs_length"] = 0


def _bad_logprob(result: dict[str, Any], value: float) -> None:
    rows = result["meta_info"].get("output_token_logprobs")
    if rows:
        rows[0][0] = value  # orjson writes nan and inf as null, as SGLang's replies do


def corrupt(result: dict[str, Any], faults: Sequence[Fault], *, vocab_size: int) -> None:
    """Apply the reply-changing faults to a ``/generate`` result object, in place."""
    if any(f.mode == "empty" for f in faults):
        _empty(result)
    for fault in faults:
        if fault.mode == "bad_ids":
            _bad_id(result, BAD_IDS.get(fault.arg or "", -1) if fault.arg != "vocab"
                    else vocab_size)
        elif fault.mode == "bad_logprob":
            _bad_logprob(result, fault.logprob)
    if any(f.mode == "wrong_types" for f in faults):
        result["meta_info"] = [result["meta_info"]]
