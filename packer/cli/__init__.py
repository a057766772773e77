"""The ``packer`` command line: each command parses, calls one library function, and turns
``PackerError`` into a one-line ``click`` error. No logic lives here.

``options`` holds the group and the shared option decorators; each other module registers the
commands of one area on the group when imported."""
from __future__ import annotations

import os

# Nothing a command runs uses BLAS, yet OpenBLAS (numpy's, OpenCV's) starts a thread per core
# at import that spins about a tenth of a CPU-second before it sleeps: one is enough. Set before
# the commands' modules import numpy; a value the user set wins (docs/writing.md, "Start-up").
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from packer.cli import images, tools, video  # noqa: F401  (register the commands)
from packer.cli.options import main

__all__ = ["main"]
