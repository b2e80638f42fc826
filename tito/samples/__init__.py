"""Sample assembly and the samples wire codec (design §6).

Pure code, no I/O: :func:`assemble` turns a trajectory's :class:`~tito.types.records.TurnRecord`
list into training :class:`Sample` objects; :func:`encode_samples` / :func:`decode_samples`
move them across the wire as one safetensors container.
"""

from tito.samples.assembly import AssemblyResult, EmptyReason, assemble
from tito.samples.codec import (
    FORMAT_VERSION,
    META_KEY,
    CodecError,
    DecodedSamples,
    decode_samples,
    encode_samples,
)
from tito.samples.routing import merge_routed_experts
from tito.samples.sample import (
    STATUSES,
    Sample,
    SampleStatus,
    sample_problem,
    samples_identical,
    status_from_finish_reason,
)

__all__ = [
    "FORMAT_VERSION",
    "META_KEY",
    "STATUSES",
    "AssemblyResult",
    "CodecError",
    "DecodedSamples",
    "EmptyReason",
    "Sample",
    "SampleStatus",
    "assemble",
    "decode_samples",
    "encode_samples",
    "merge_routed_experts",
    "sample_problem",
    "samples_identical",
    "status_from_finish_reason",
]
