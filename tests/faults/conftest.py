"""The fault suites' shared inputs and reference outputs, made once per session (per xdist
worker) rather than once per module: every suite reads them, none changes them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.faults import Conversion, make_source, snapshot
from tests.support.killing import run_packer


@pytest.fixture(scope="session")
def sources(tmp_path_factory) -> dict[str, Path]:
    """One small input of each kind, made once per session (per xdist worker); read-only."""
    root = tmp_path_factory.mktemp("sources")
    return {kind: make_source(kind, root / kind) for kind in ("images", "videos")}


@pytest.fixture(scope="session")
def references(sources, tmp_path_factory):
    """``references(conv) -> (snapshot, largest file size)`` of an uninterrupted run, made once."""
    root, done = tmp_path_factory.mktemp("refs"), {}

    def get(conv: Conversion) -> tuple[dict[str, Any], int]:
        if conv.id not in done:
            out = conv.out(root, conv.id)
            r = run_packer(*conv.argv(sources[conv.source], out, "--workers", 0))
            assert r.returncode == 0, r.stderr
            files = [out] if out.is_file() else [p for p in out.rglob("*") if p.is_file()]
            done[conv.id] = (snapshot(conv, out), max(p.stat().st_size for p in files))
        return done[conv.id]

    return get
