"""Helpers shared by the tests (none of them a test): generated inputs (``inputs``), output
snapshots (``outputs``), the fault suite's conversions (``faults``), real SIGKILLs (``killing``),
paused concurrent runs (``concurrency``), served outputs (``served``; the servers themselves are
``scripts/servers.py``, shared with the benchmark), the
normalization reference (``normalize``), the protobuf Datum (``protobuf``); data: the
worker-death hook (``worker_death/``) and the mmaction2 sampler reference (``reference/``)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["REPO", "FIXTURES", "FIXTURE_IMAGES", "FIXTURE_VIDEOS", "SUPPORT"]

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parent.parent
FIXTURES = REPO / "tests" / "fixtures"
FIXTURE_IMAGES = FIXTURES / "images"
FIXTURE_VIDEOS = FIXTURES / "videos"
