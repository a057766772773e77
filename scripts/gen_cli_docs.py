"""Write docs/cli.md, the command-line reference, from the ``--help`` of ``packer`` and of each
of its commands (click's own help text, so the page cannot say what the CLI does not).

    python scripts/gen_cli_docs.py            # rewrite docs/cli.md
    python scripts/gen_cli_docs.py --check    # exit 1 if docs/cli.md is stale

``tests/test_docs.py`` fails when the page differs from what this prints.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click
from click.testing import CliRunner

__all__ = ["render", "main"]

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
WIDTH = 100  # fixed, so the page does not depend on the terminal that made it
REFRESH = "python scripts/gen_cli_docs.py"


def _help(group: click.Group, args: list[str]) -> str:
    result = CliRunner().invoke(group, [*args, "--help"], prog_name="packer",
                                terminal_width=WIDTH, max_content_width=WIDTH)
    if result.exit_code != 0:
        raise RuntimeError(f"packer {' '.join(args)} --help exited {result.exit_code}: {result.output}")
    return result.output.rstrip() + "\n"


def render(group: click.Group | None = None) -> str:
    """The reference page for ``group`` (default: the ``packer`` CLI) as Markdown.

    Args:
        group: the click group to document; ``packer.cli.main`` when None.

    Returns:
        The page: the group's help, then one section per command in name order.
    """
    if group is None:
        from packer.cli import main as group
    parts = ["# Command-line reference\n",
             f"<!-- Generated from --help by scripts/gen_cli_docs.py; do not edit. Refresh: {REFRESH} -->\n",
             "Every command, with the text its `--help` prints. The library function behind each "
             "command takes the same options as keywords (README.md, \"Commands\").\n",
             "## packer\n", "```text\n" + _help(group, []) + "```\n"]
    for name in sorted(group.commands):
        parts += [f"## packer {name}\n", "```text\n" + _help(group, [name]) + "```\n"]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Rewrite docs/cli.md, or with ``--check`` report whether it is stale (exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is stale; write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"{PAGE} is stale: run {REFRESH}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
