"""``tito view PATH``: the trajectory viewer on a ``samples.parquet`` written by ``tito rollout``.

Serves the page of the gateway's ``/ui`` over the file (read-only; one entry per sample)
on a local address, prints ``tito view listening on http://HOST:PORT`` and the viewer's
URL, and serves until Ctrl-C. Token text needs the rollout's tokenizer: ``--tokenizer``,
else the one named in the ``summary.json`` beside the file, else the embedded model's for
an embedded rollout; without one the strip shows token ids.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from tito.client.writers import SAMPLES_FILE, SUMMARY_FILE
from tito.net import AppServer, bind_tcp
from tito.server.ui.parquet import ParquetSource
from tito.server.ui.strip import Texts
from tito.server.ui.text import decoder_of, token_texts
from tito.server.ui.viewer import viewer_app
from tito.types.errors import ConfigError, TitoError
from tito.types.tokenizer import Tokenizer, load_tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH",
                   help=f"a {SAMPLES_FILE} written by `tito rollout`, or the folder it is in")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help=f"tokenizer folder for token text (default: the one in the "
                        f"{SUMMARY_FILE} beside the file, or the embedded model's; without "
                        "one, token ids are shown)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (whoever reaches it can read the file)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any free)")


def samples_path(path: str) -> Path:
    found = Path(path)
    if found.is_dir():
        found = found / SAMPLES_FILE
    if not found.is_file():
        raise ConfigError(f"{path!r}: no such file (expected {SAMPLES_FILE} or its folder)")
    return found


def rollout_config(samples: Path) -> dict[str, Any]:
    """The ``config`` the rollout recorded in the summary beside ``samples`` (or {})."""
    summary = samples.parent / SUMMARY_FILE
    try:
        config = json.loads(summary.read_text(encoding="utf-8")).get("config")
    except (OSError, ValueError, AttributeError):
        return {}
    return config if isinstance(config, dict) else {}


def find_tokenizer(samples: Path, given: str | None) -> tuple[Tokenizer | None, str]:
    """(the tokenizer, where it came from); (None, why not) when none is at hand."""
    if given is not None:
        return load_tokenizer(given), given
    config = rollout_config(samples)
    named = config.get("tokenizer")
    if isinstance(named, str) and named:
        for folder in (Path(named), samples.parent / named):
            if folder.is_dir():
                return load_tokenizer(folder), str(folder)
        return None, f"the rollout's tokenizer {named!r} is not here"
    if config.get("engine") == "embedded":
        try:
            from tito.engines.embedded_tokenizer import load_embedded_tokenizer

            return load_embedded_tokenizer(), "the embedded model's"
        except Exception as exc:
            return None, f"the embedded model's tokenizer did not load ({exc})"
    return None, "no tokenizer named"


def text_of(tokenizer: Tokenizer | None) -> Texts | None:
    if tokenizer is None:
        return None
    decode = decoder_of(tokenizer)
    return lambda ids: token_texts(ids.tolist(), decode)


def run(args: argparse.Namespace) -> int:
    """Exit 2 when the file or the tokenizer cannot be read; else serve until a signal."""
    try:
        path = samples_path(args.path)
        tokenizer, origin = find_tokenizer(path, args.tokenizer)
        source = ParquetSource(path, texts=text_of(tokenizer),
                               tokenizer=origin if tokenizer is not None else None)
    except TitoError as exc:
        print(f"tito view: {exc.message}", file=sys.stderr)
        return 2
    if tokenizer is None:
        print(f"tito view: {origin}: token ids are shown (pass --tokenizer DIR for text)",
              file=sys.stderr)
    app = viewer_app(source, host=args.host)
    try:
        sock = bind_tcp(args.host, args.port)
    except OSError as exc:
        print(f"tito view: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    asyncio.run(_serve(app, sock, path, len(source)))
    return 0


async def _serve(app: Any, sock: Any, path: Path, rows: int) -> None:
    server = AppServer(app, sock, handle_signals=True)
    await server.start()
    print(f"tito view listening on {server.url}", flush=True)
    print(f"viewer: {server.url}/ui/ ({rows} samples of {path}; Ctrl-C stops)", flush=True)
    await server.wait()
