"""The ``tito`` command line: ``serve``, ``rollout``, ``mock-engine``, ``verify-template``,
``view``, ``journal``.

One module per subcommand in this package, each with an ``add_arguments(parser)`` /
``run(args) -> exit status`` pair, so ``tito X --help`` documents every flag. This is the
top layer (design §3): it may import anything; nothing imports it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module implementing add_arguments/run, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("tito.cli.serve", "run the TITO gateway HTTP server"),
    "mock-engine": ("tito.cli.mock_engine", "run an SGLang-compatible scriptable mock engine"),
    "verify-template": ("tito.cli.verify_template",
                        "verify a family's append-only rendering and parsing on a tokenizer"),
    "rollout": ("tito.cli.rollout",
                "run an agent over a dataset through the gateway and write training samples"),
    "view": ("tito.cli.view", "open the trajectory viewer on a samples.parquet of `tito rollout`"),
    "journal": ("tito.cli.journal", "check (and repair) the --journal folder of `tito serve`"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported (its flags are the only ones needed)."""
    parser = argparse.ArgumentParser(
        prog="tito",
        description="TITO Gateway: exact tokens of multi-turn agent rollouts for RL trainers.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        if command == name:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    result = args._module.run(args)
    return int(result or 0)
