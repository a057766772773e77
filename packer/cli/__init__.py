"""The ``packer`` command line: each command parses, calls one library function, and turns
``PackerError`` into a one-line ``click`` error. No logic lives here.

``options`` holds the group and the shared option decorators; each other module registers the
commands of one area on the group when imported."""
from __future__ import annotations

from packer.cli import images, tools, video  # noqa: F401  (register the commands)
from packer.cli.options import main

__all__ = ["main"]
