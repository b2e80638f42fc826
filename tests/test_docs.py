"""Docs stay current: every CLI flag is documented, the README keeps its two commands."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

from tito.cli import SUBCOMMANDS

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_flag_is_in_cli_reference(command: str) -> None:
    parser = argparse.ArgumentParser()
    importlib.import_module(SUBCOMMANDS[command][0]).add_arguments(parser)
    reference = (REPO / "docs" / "cli.md").read_text()
    assert f"## `tito {command}`" in reference
    section = reference.split(f"## `tito {command}`", 1)[1].split("\n## ", 1)[0]
    flags = [opt for action in parser._actions for opt in action.option_strings
             if opt.startswith("--") and opt != "--help"]
    missing = [flag for flag in flags if f"`{flag}" not in section]
    assert not missing, f"undocumented flags of tito {command}: {missing}"


def test_readme_two_commands_and_ci() -> None:
    readme = (REPO / "README.md").read_text()
    assert "bash scripts/install.sh && tito rollout" in readme
    assert "bash scripts/test.sh" in readme
    assert "exec bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_links_between_docs_point_at_files_and_headings() -> None:
    pages = {path.name: path.read_text() for path in (REPO / "docs").glob("*.md")}
    anchors = {name: {_slug(line.lstrip("#")) for line in text.splitlines()
                      if line.startswith("#")} for name, text in pages.items()}
    broken = []
    for name, text in pages.items():
        for target, anchor in re.findall(r"\]\(([\w\-]+\.md)(?:#([\w\-]+))?\)", text):
            if target not in pages:
                broken.append(f"{name} -> {target}")
            elif anchor and anchor not in anchors[target]:
                broken.append(f"{name} -> {target}#{anchor}")
    assert not broken, f"links to missing pages or headings: {broken}"
