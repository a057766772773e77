"""The layers docs/architecture.md draws are the layers of the code: import-linter's
contracts in pyproject.toml (layers, the training side apart from the conversion side, readers
apart from writers, no import cycles) hold."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    pytest.importorskip("importlinter")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                        "lint_imports_command()", "--no-cache"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_public_api_names_exist():
    import packer
    import packer.data

    for module in (packer, packer.data):
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, f"{module.__name__}.__all__ names that do not exist: {missing}"


def test_every_command_has_a_library_function():
    """The CLI is a layer over packer.api: each command's body calls the function of its name."""
    from packer.cli import main

    commands_to_api = {"to-lmdb": "pack", "to-hdf5": "pack", "to-records": "pack", "resize": "resize",
                       "decode-frames": "decode_frames", "pack-videos": "pack_videos", "merge": "merge",
                       "verify": "verify", "inspect": "inspect", "index": "index", "bench": "bench", "demo": "demo"}
    assert set(main.commands) == set(commands_to_api)
    import packer

    for fn in set(commands_to_api.values()):
        assert callable(getattr(packer, fn)) and getattr(packer, fn).__doc__
