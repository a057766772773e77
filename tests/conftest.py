"""Shared fixtures: small generated datasets and the real-world files in ``tests/fixtures``
(inside the repository, see its README.md for provenance and licences). The helpers behind
them live in ``tests/support``. At the end of a session the suite checks that it left no
process behind (``pytest_sessionfinish`` below)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.support import processes

processes.mark_session()  # before anything starts a process: every one carries the session's mark

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402
from PIL import Image  # noqa: E402

from packer.synth import natural_image  # noqa: E402

# No hypothesis example may fail for being slow: its 200 ms deadline is a timing assertion, and on
# a busy machine a file-system example took 692 ms once (test_frame_dirs_unique_or_refused).
settings.register_profile("packer", deadline=None)
settings.load_profile("packer")
from tests.support import FIXTURE_IMAGES, FIXTURE_VIDEOS, FIXTURES, REPO, zygote  # noqa: E402,F401
from tests.support.inputs import write_image_folder, write_video_folder  # noqa: E402
from scripts.timing import scaled  # noqa: E402

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


@pytest.hookimpl(trylast=True)
def pytest_configure(config) -> None:
    """The per-test timeout (pyproject's, pytest-timeout's) stretched with the machine's load
    (scripts/timing.py; after pytest-timeout has read it). In an xdist worker, torch
    computes on one thread: the workers already outnumber the cores, and torch's intra-op
    threads on top of them spin for CPU the other workers need (about a fifth of the CPU time of
    the model-training tests). Serial runs keep torch's default."""
    if getattr(config, "_env_timeout", None):
        config._env_timeout = scaled(config._env_timeout)
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
    "tests/conversion/test_plans.py", "tests/faults/test_faults_disk.py", "tests/data/test_multigrid.py",
    "tests/remote/test_remote_pinning.py", "tests/data/test_elastic_samplers.py",
    "tests/benchmark/test_video.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Keep the run's whole collection (tests/test_docs.py counts the fault suites from it
    instead of collecting them again in a subprocess), stretch the tests' own timeouts with the
    machine's load, then start the longest modules first."""
    config.stash[COLLECTED] = [(i.nodeid, i.get_closest_marker("slow") is not None) for i in items]
    for item in items:  # a test's own timeout marker, stretched as the default one is
        marker = item.get_closest_marker("timeout")
        if marker is not None and marker.args and marker.args[0]:
            item.add_marker(pytest.mark.timeout(scaled(marker.args[0]), *marker.args[1:], **marker.kwargs),
                            append=False)
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda i: rank.get(i.nodeid.split("::", 1)[0], len(rank)))  # stable: order within a module


#: what the xdist workers found left behind, for the controller's report
LEFT_BEHIND = pytest.StashKey[list]()


def pytest_testnodedown(node, error) -> None:
    """(xdist controller) keep what a worker found left behind below it, for the report."""
    left = getattr(node, "workeroutput", {}).get("packer_left_behind", [])
    node.config.stash.setdefault(LEFT_BEHIND, []).extend(f"[{node.gateway.id}] {p}" for p in left)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """The suite leaves no process behind. After the session's own teardown (fixtures, and in
    an xdist controller its workers), every pytest process ends its test zygotes and SIGKILLs
    what still runs below it; the session's first process also ends whatever carries the
    session's mark (tests/support/processes.py: what lost its parent too) and fails the run
    naming each process found, its own and its workers'."""
    result = yield
    zygote.close_all()
    left = [str(p) for p in processes.end(lambda: processes.descendants(os.getpid()))]
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker: its controller reports
        config.workeroutput["packer_left_behind"] = left
        return result
    mark = os.environ[processes.MARK]
    left += [str(p) for p in processes.end(lambda: processes.marked(mark))]
    found = config.stash.get(LEFT_BEHIND, []) + left
    if found:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        lines = ["the suite left processes behind (now SIGKILLed):", *found]
        if reporter is not None:
            reporter.write_sep("=", "processes left behind", red=True)
            for line in lines:
                reporter.write_line(line)
        else:
            print("\n".join(lines), file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result


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