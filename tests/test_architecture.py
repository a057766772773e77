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
                       "export": "export", "verify": "verify", "inspect": "inspect", "index": "index", "bench": "bench",
                       "demo": "demo"}
    assert set(main.commands) == set(commands_to_api)
    import packer

    for fn in set(commands_to_api.values()):
        assert callable(getattr(packer, fn)) and getattr(packer, fn).__doc__


def test_public_classes_show_their_parameters():
    """No public class hides parameters behind ``**kwargs``: its constructor and its class-level
    builders name every keyword they take (``help()`` lists them all)."""
    import inspect

    import packer
    import packer.data

    hidden = []
    for module in (packer, packer.data):
        for name in module.__all__:
            cls = getattr(module, name)
            if not inspect.isclass(cls) or issubclass(cls, BaseException):
                continue
            members = {"__init__": cls.__init__}
            members.update({k: getattr(cls, k) for k, v in vars(cls).items()
                            if isinstance(v, (classmethod, staticmethod)) and not k.startswith("_")})
            for attr, fn in members.items():
                try:
                    params = inspect.signature(fn).parameters.values()
                except (TypeError, ValueError):
                    continue
                if any(p.kind is p.VAR_KEYWORD for p in params) and fn is not object.__init__:
                    hidden.append(f"{module.__name__}.{name}.{attr}")
    assert hidden == [], f"public classes taking **kwargs: {sorted(set(hidden))}"
