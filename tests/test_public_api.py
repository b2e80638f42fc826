"""The pinned public API: ``tito.__all__`` is the client surface, and docs import only it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tito

REPO = Path(__file__).resolve().parents[1]

PUBLIC = [
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


def test_all_is_pinned() -> None:
    assert tito.__all__ == PUBLIC, "changing the public API? update PUBLIC and the docs"


def test_every_public_name_resolves_to_its_implementation() -> None:
    from tito.client.agent import generate
    from tito.client.tracer import SessionTracer
    from tito.samples.codec import decode_samples
    from tito.samples.sample import Sample

    assert tito.generate is generate and tito.SessionTracer is SessionTracer
    assert tito.decode_samples is decode_samples and tito.Sample is Sample
    for name in PUBLIC:
        assert getattr(tito, name) is not None
    assert sorted(dir(tito)) == sorted(PUBLIC)


def test_unknown_attribute_is_an_attribute_error() -> None:
    try:
        tito.no_such_thing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_import_tito_is_cheap() -> None:
    code = "import sys, tito; print(sorted(m for m in sys.modules if m.startswith('tito.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_docs_import_only_the_public_api() -> None:
    pattern = re.compile(r"^\s*(from tito[.\w]* import .*|import tito[.\w]*)", re.M)
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for match in pattern.finditer(doc.read_text()):
            line = match.group(1).strip()
            if not line.startswith("from tito import "):
                found.append(f"{doc.name}: {line}")
            else:
                names = [n.strip() for n in line.removeprefix("from tito import ").split(",")]
                found += [f"{doc.name}: {n} is not public" for n in names if n not in PUBLIC]
    assert not found, "\n".join(found)
