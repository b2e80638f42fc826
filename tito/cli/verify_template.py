"""``tito verify-template``: run the append-only verifier for a family on a tokenizer (CPU).

Prints a per-case table and a verdict; exit status 1 on any failure, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any

from tito.render.verify import VerifyReport, verify_renderer
from tito.types.errors import TitoError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tito.render.families import FAMILIES

    parser.add_argument("--tokenizer", required=True,
                        help="tokenizer folder (tokenizer.json, vocab.json+merges.txt, "
                             "*.tiktoken, tekken*.json), or 'standin' for a family's "
                             "documented stand-in tokenizer")
    parser.add_argument("--family", required=True, choices=sorted(FAMILIES),
                        help="model family")
    parser.add_argument("--template", default=None,
                        help="chat template file to verify (only with --family default)")
    parser.add_argument("--stop-token", default=None,
                        help="end-of-turn token (only with --family default; default: the "
                             "template's own end marker, then the tokenizer's EOS)")
    parser.add_argument("--thinking", choices=["on", "off", "both"], default="both",
                        help="thinking modes to verify (families with a thinking switch)")
    parser.add_argument("--kwargs", default=None,
                        help="extra chat-template kwargs as a JSON object")
    parser.add_argument("--no-audit", action="store_true",
                        help="leave out the audit corpus (tito/render/audit.py): only the "
                             "standard trajectories, as the gateway's self-check runs")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--verbose", action="store_true",
                        help="list every case, not only trajectories with failures")


def report_rows(report: VerifyReport) -> list[tuple[str, str, str, str, str]]:
    """(trajectory, variant, check, passed/total, first failure) per group."""
    groups: dict[tuple[str, str, str], list[Any]] = defaultdict(list)
    for case in report.cases:
        groups[(case.trajectory, case.variant, case.check)].append(case)
    rows = []
    for (traj, variant, check), cases in groups.items():
        ok = sum(c.passed for c in cases)
        fail = next((c for c in cases if not c.passed), None)
        detail = "" if fail is None else f"split {fail.split}, {fail.reason}: {fail.detail}"
        rows.append((traj, variant, check, f"{ok}/{len(cases)}", detail))
    return rows


def print_report(report: VerifyReport, *, verbose: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title=f"tito verify-template: {report.family}")
    for col in ("trajectory", "mode", "check", "passed", "first failure"):
        table.add_column(col, overflow="fold")
    for traj, variant, check, ratio, detail in report_rows(report):
        ok, total = ratio.split("/")
        if verbose or ok != total:
            style = "green" if ok == total else "red"
            table.add_row(traj, variant, check, f"[{style}]{ratio}[/{style}]", detail)
    console.print(table)
    for check, (passed, cases) in sorted(report.checks().items()):
        console.print(f"  {check}: {passed}/{cases}")
    console.print(f"  roles exercised: {', '.join(sorted(report.roles_exercised)) or '-'}; "
                  f"modes: {', '.join(report.variants) or '-'}")
    if report.skipped:
        console.print(f"  skipped (a role the family does not append): "
                      f"{', '.join(sorted(set(report.skipped)))}")
    if report.reasons():
        console.print("  failure reasons: " + ", ".join(
            f"{reason} {n}" for reason, n in sorted(report.reasons().items())))
    verdict = "[green]PASS[/green]" if report.passed else "[red]FAIL[/red]"
    console.print(f"verdict: {verdict} ({len(report.cases)} cases)")


def run(args: argparse.Namespace) -> int:
    from tito.render.families import build_renderer

    try:
        kwargs = json.loads(args.kwargs) if args.kwargs else None
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ValueError("--kwargs must be a JSON object")
        renderer = build_renderer(args.family, args.tokenizer, chat_template=args.template,
                                  stop_token=args.stop_token)
        report = verify_renderer(renderer, thinking=args.thinking, kwargs=kwargs,
                                 audit=not args.no_audit)
    except (TitoError, ValueError, OSError) as exc:
        print(f"tito verify-template: {getattr(exc, 'message', exc)}")
        return 2
    if args.json:
        print(json.dumps({**report.summary(), "family": report.family,
                          "checks": {k: list(v) for k, v in report.checks().items()},
                          "cases": [c.__dict__ for c in report.cases if not c.passed]},
                         ensure_ascii=False, indent=1))
    else:
        print_report(report, verbose=args.verbose)
    return 0 if report.passed else 1
