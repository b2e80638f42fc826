"""The pinned public API: ``tito.__all__`` is the client surface, plus each framework
integration's ``__all__`` (loaded by path, e.g. ``tito.integrations.miles.generate``);
docs import only these."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tito
from tito.integrations import miles

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
INTEGRATIONS = {
    "tito.integrations.miles": ["GenerateOutput", "LegacyGenerateAdapter", "add_arguments",
                                "generate", "generate_legacy", "load_generate_function"],
}


def test_all_is_pinned() -> None:
    assert tito.__all__ == PUBLIC, "changing the public API? update PUBLIC and the docs"


def test_integrations_are_pinned() -> None:
    assert miles.__all__ == INTEGRATIONS["tito.integrations.miles"]
    assert all(getattr(miles, name) is not None for name in miles.__all__)


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
            module, _, imported = line.removeprefix("from ").partition(" import ")
            public = PUBLIC if module == "tito" else INTEGRATIONS.get(module)
            if public is None:
                found.append(f"{doc.name}: {line}")
            else:
                names = [n.strip() for n in imported.split(",")]
                found += [f"{doc.name}: {n} is not public" for n in names if n not in public]
    assert not found, "\n".join(found)
