"""Shared fixtures: small generated datasets and the real-world files in ``tests/fixtures``
(inside the repository, see its README.md for provenance and licences). The helpers behind
them live in ``tests/support``."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.synth import natural_image
from tests.support import FIXTURE_IMAGES, FIXTURE_VIDEOS, FIXTURES, REPO  # noqa: F401
from tests.support.inputs import write_image_folder, write_video_folder

# Compiled modules are cached in __pycache__ even where the environment says not to (this
# project's development machines set PYTHONDONTWRITEBYTECODE=1): otherwise every xdist worker
# rewrites and compiles every test module, and every packer process a test starts compiles the
# modules changed since their .pyc files were written (the workers and the processes inherit it).
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

# tests/test_docs.py (and scripts that put tests/ on sys.path) import this module by its bare
# name for REPO; tests/ is a package now, so give the bare name the module pytest loaded.
sys.modules.setdefault("conftest", sys.modules[__name__])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int | None:
    """Workers for ``-n auto`` (pyproject's addopts): one more than the usable cores, as most of
    the suite waits on subprocesses (3 on a 2-core machine).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set; ``-n 0`` runs serially."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


def pytest_configure(config) -> None:
    """In an xdist worker, torch computes on one thread: the workers already outnumber the
    cores, and torch's intra-op threads on top of them spin for CPU the other workers need
    (about a fifth of the CPU time of the model-training tests). Serial runs keep torch's default."""
    if hasattr(config, "workerinput"):
        import torch

        torch.set_num_threads(1)


#: every test pytest collected in this run, before -k/-m deselection: (node id, marked slow).
COLLECTED = pytest.StashKey[list]()


#: the modules that take longest (``pytest --durations=0``, summed per file), started first so
#: that xdist's workers end together instead of one finishing a long test alone; tests keep their
#: order inside a module (module fixtures are set up once). Only the order: a stale list is harmless.
LONGEST_FIRST = (
    "tests/scripts/test_bench_scripts.py", "tests/conversion/test_executors_ray.py",
    "tests/faults/test_faults_crash.py", "tests/faults/test_faults_concurrent.py",
    "tests/faults/test_faults_resume.py", "tests/data/test_video_packs.py", "tests/data/test_video_copy.py",
    "tests/benchmark/test_run.py", "tests/conversion/test_resume.py", "tests/faults/test_faults_workers.py",
    "tests/conversion/test_parallel_write.py", "tests/faults/test_faults_disk.py", "tests/data/test_multigrid.py",
    "tests/remote/test_remote_pinning.py", "tests/data/test_elastic_samplers.py",
    "tests/benchmark/test_video.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Keep the run's whole collection (tests/test_docs.py counts the fault suites from it
    instead of collecting them again in a subprocess), then start the longest modules first."""
    config.stash[COLLECTED] = [(i.nodeid, i.get_closest_marker("slow") is not None) for i in items]
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda i: rank.get(i.nodeid.split("::", 1)[0], len(rank)))  # stable: order within a module


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    """24 JPEGs in 3 classes; read-only for tests (copy before changing)."""
    return write_image_folder(tmp_path_factory.mktemp("imgs") / "src")


@pytest.fixture
def mixed_folder(tmp_path) -> Path:
    """Good JPEG/PNG images plus the bad inputs of the error policy."""
    root = write_image_folder(tmp_path / "mixed", count=6, classes=2)
    rng = np.random.default_rng(1)
    Image.fromarray(natural_image(rng, 40, 50)).save(root / "class_0" / "png_one.png")
    good = (root / "class_0" / "img_0000.jpg").read_bytes()
    (root / "class_1" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "class_1" / "zero.jpg").write_bytes(b"")
    (root / "class_1" / "text.jpg").write_text("this is not an image\n")
    (root / "class_0" / ".hidden.jpg").write_bytes(good)
    (root / "class_0" / "notes.txt").write_text("skipped by the extension filter")
    return root


@pytest.fixture(scope="session")
def video_folder(tmp_path_factory) -> Path:
    """Two classes of two synthetic videos (24/25 frames, 48x64); read-only for tests."""
    return write_video_folder(tmp_path_factory.mktemp("videos") / "src")