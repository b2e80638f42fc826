"""``tito journal check DIR [--repair]``: check a ``--journal`` folder (every worker's,
under ``--workers``) without starting a gateway; ``--repair`` rewrites a damaged journal
as a start would. Exit status: 0 clean (or repaired), 1 damage found, 2 a usage error
(no journal there, or a gateway holds it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from tito.server.journal.check import check, describe, journal_files
from tito.types.errors import TitoError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["check"], help="what to do with the journal")
    parser.add_argument("dir", metavar="DIR", help="the --journal folder of `tito serve`")
    parser.add_argument("--repair", action="store_true",
                        help="rewrite a damaged journal without its damage (sessions that "
                             "lost frames become tombstones); not while a gateway runs on it")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")


def run(args: argparse.Namespace) -> int:
    folders = journal_files(Path(args.dir))
    if not folders:
        print(f"tito journal: no journal in {args.dir!r}", file=sys.stderr)
        return 2
    reports = []
    try:
        for folder in folders:
            reports.append(check(folder, repair=args.repair))
    except TitoError as exc:
        print(f"tito journal: {exc.message}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(orjson.dumps([r.to_json() for r in reports],
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        for report in reports:
            print("\n".join(describe(report)))
    damaged = any(r.damage or r.affected for r in reports)
    if args.repair and damaged:
        print("repaired: the damaged file is kept as journal.bin.damaged")
        return 0
    return 1 if damaged else 0
