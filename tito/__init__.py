"""TITO Gateway: exact tokens of multi-turn agent rollouts for RL trainers.

The public client API (design §7): create a session, hand its URL to an agent, collect
its training samples, decode the wire payload::

    from tito import SessionTracer, generate

    async with SessionTracer("http://127.0.0.1:8000") as tracer:
        samples = await generate(run_agent, prompt, {"max_new_tokens": 256}, tracer=tracer)

Names are imported on first use, so ``import tito`` stays cheap (no server, no engine,
no torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "SessionTracer": "tito.client.tracer",
    "TracedSession": "tito.client.tracer",
    "CollectError": "tito.client.tracer",
    "generate": "tito.client.agent",
    "AgentFn": "tito.client.agent",
    "Sample": "tito.samples.sample",
    "DecodedSamples": "tito.samples.codec",
    "CodecError": "tito.samples.codec",
    "decode_samples": "tito.samples.codec",
}

__all__ = [
    "AgentFn",
    "CodecError",
    "CollectError",
    "DecodedSamples",
    "Sample",
    "SessionTracer",
    "TracedSession",
    "__version__",
    "decode_samples",
    "generate",
]

if TYPE_CHECKING:
    from tito.client.agent import AgentFn, generate
    from tito.client.tracer import CollectError, SessionTracer, TracedSession
    from tito.samples.codec import CodecError, DecodedSamples, decode_samples
    from tito.samples.sample import Sample


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tito' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
