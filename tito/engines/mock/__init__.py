"""A CPU HTTP server faithful to SGLang 0.5.x native ``/generate`` (``tito mock-engine``).

Same routes, fields and shapes as SGLang (design §8): ``input_ids`` in, ``output_ids``
(stop id included) and ``[logprob, id, text|null]`` triples out, finish-reason objects
(``stop``/``length``/``abort``), a simulated radix cache (``cached_tokens``), abort by rid
prefix, pause/continue, weight version, fake MoE routing replay, HTTP 400 on unknown
``sampling_params`` keys. The "model" is scripted by
directives in the last user/tool message (:mod:`tito.engines.mock.directives`).

Test hooks: ``GET /mock/requests`` (the request log in arrival order) and
``DELETE /mock/requests``.

Modules:

- :mod:`~tito.engines.mock.contract`: SGLang's request contract (JSON types, value checks);
- :mod:`~tito.engines.mock.directives`: the scripted model (directives -> planned ids);
- :mod:`~tito.engines.mock.radix`: the prefix cache behind ``cached_tokens``;
- :mod:`~tito.engines.mock.lifecycle`: admission, token-by-token generation, abort, pause;
- :mod:`~tito.engines.mock.replies`: the ``/generate`` reply object and stream chunks;
- :mod:`~tito.engines.mock.streaming`: ``stream: true`` as SGLang streams, cumulative or
  incremental (``--incremental-streaming-output``), with its coalescing;
- :mod:`~tito.engines.mock.faults`: fault injection (``--fault``, ``FAULT`` directives):
  which faults, what they change in a reply;
- :mod:`~tito.engines.mock.faulty`: how a faulty reply goes out (error status, cut body,
  connection reset);
- :mod:`~tito.engines.mock.routes`: the Starlette app (:class:`MockEngine`).

The command line is :mod:`tito.cli.mock_engine`.
"""

from tito.engines.mock.contract import (
    SAMPLING_KEYS,
    ContractError,
    RequestError,
    check_sampling_params,
)
from tito.engines.mock.directives import MockModel, Plan, parse_directives
from tito.engines.mock.faults import FAULT_MODES, Fault, parse_fault
from tito.engines.mock.lifecycle import MockConfig, ReqState
from tito.engines.mock.radix import RadixCache
from tito.engines.mock.routes import MockEngine, build_engine

__all__ = [
    "FAULT_MODES",
    "SAMPLING_KEYS",
    "ContractError",
    "Fault",
    "MockConfig",
    "MockEngine",
    "MockModel",
    "Plan",
    "RadixCache",
    "ReqState",
    "RequestError",
    "build_engine",
    "check_sampling_params",
    "parse_directives",
    "parse_fault",
]
