"""The Ray executor keeps the executors' contract (ordered outcomes, failures as Outcomes) on
a real local Ray instance (``ray.init(num_cpus=2)``) and packs byte-identical output."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.errors import CorruptSample, UsageError
from scripts.timing import scaled
from packer.conversion.executors import InlineExecutor, LocalExecutor, make_executor
from packer.formats.sidecars import partial_path
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions
from tests.support import REPO
from tests.support.inputs import write_image_folder
from tests.support.killing import checkpoint_at_least, packer_cmd, run_and_kill
from tests.support.outputs import packed_snapshot

# xdist: these tests share one worker, so the local Ray instance (a module fixture) starts once
pytestmark = pytest.mark.xdist_group("ray")


def work(x: int) -> int:
    """Squares, with the failure kinds of the error policy on chosen inputs."""
    if x % 7 == 3:
        raise CorruptSample(str(x), f"item-{x}", "bad input", stage="decode")
    if x % 11 == 5:
        raise RuntimeError("decoder bug")
    return x * x


def outcomes(executor, items):
    return [(o.ok, o.value, o.stage, o.reason) for o in executor.map(work, items)]


def test_local_executors_agree_in_order():
    items = list(range(60))
    want = outcomes(InlineExecutor(), items)
    with LocalExecutor(workers=2, chunk_size=3, window=2) as ex:
        assert outcomes(ex, items) == want
    assert want[3] == (False, None, "decode", "bad input")
    assert want[5] == (False, None, "internal", "RuntimeError: decoder bug")


def test_missing_ray_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without Ray looks like
    with pytest.raises(UsageError, match=r"pip install 'packer\[ray\]'"):
        make_executor("ray", workers=2)


def test_unknown_executor_and_bad_workers():
    with pytest.raises(UsageError, match="known: local, ray"):
        make_executor("spark")
    with pytest.raises(UsageError, match="--workers"):
        make_executor("ray", workers=-1)


def test_ray_address_needs_ray_executor(image_folder, tmp_path):
    r = CliRunner().invoke(main, ["to-lmdb", str(image_folder), str(tmp_path / "o"), "--ray-address", "auto"])
    assert r.exit_code == 2 and "--ray-address needs --executor ray" in r.output
    assert not (tmp_path / "o").exists()


# -- on a real local Ray instance ---------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    # address="local": a new instance for this test, never a cluster `ray start` left on the machine
    # Workers import this module's work functions by name (tests.conversion....): put the
    # repository on their path.
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="WARNING", runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


def hang_or_crash(x: int) -> int:
    if x == 4:
        time.sleep(120)  # a decoder that hangs
    if x == 9:
        os.kill(os.getpid(), signal.SIGKILL)  # a decoder that segfaults
    return work(x)


@pytest.mark.slow
def test_ray_map_is_ordered_with_failures(ray_cluster):
    items = list(range(60))
    with make_executor("ray", workers=2) as ex:
        assert ex.name == "ray" and ex.workers == 2
        assert outcomes(ex, items) == outcomes(InlineExecutor(), items)
    assert ray_cluster.is_initialized()  # an executor leaves a cluster it did not start running


@pytest.mark.slow
def test_ray_timeout_and_crash_cost_one_item(ray_cluster):
    from packer.conversion.executors import RayExecutor

    items = list(range(12))
    with RayExecutor(workers=2, timeout=scaled(3)) as ex:  # (a loaded machine's tasks take longer; the hang is 120 s)
        got = list(ex.map(hang_or_crash, items))
    assert (got[4].ok, got[4].stage) == (False, "timeout")
    assert (got[9].ok, got[9].stage) == (False, "crash")
    rest = [i for i in items if i not in (4, 9)]
    assert [(got[i].ok, got[i].value) for i in rest] == [(o[0], o[1]) for o in outcomes(InlineExecutor(), rest)]
    with RayExecutor(workers=2, chunk_size=4) as ex:  # no timeout: chunks; a crash is narrowed down
        got = list(ex.map(hang_or_crash, rest + [9]))
    assert [(o.ok, o.value, o.stage) for o in got[:-1]] == [o[:3] for o in outcomes(InlineExecutor(), rest)]
    assert (got[-1].ok, got[-1].stage) == (False, "crash")


@pytest.mark.slow
def test_ray_output_byte_identical_to_local_pool(ray_cluster, mixed_folder, tmp_path):
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    pack_images(mixed_folder, local, run_options=RunOptions(workers=2, max_failures=3))
    report = pack_images(mixed_folder, on_ray, run_options=RunOptions(workers=2, max_failures=3, executor="ray"))
    assert report.count == 7 and report.failed == 3
    files = lambda out: {p.name: p.read_bytes() for p in sorted(out.iterdir())  # noqa: E731
                         if p.name not in ("packer.json", "lock.mdb")}
    assert files(on_ray) == files(local)  # data.mdb, keys.json, checksums.bin, failures.jsonl
    assert packed_snapshot(on_ray) == packed_snapshot(local)


@pytest.mark.slow
def test_cli_executor_ray_resumes_a_killed_local_run(ray_cluster, tmp_path):
    """A run killed halfway on the local pool finishes on Ray with --resume: same output."""
    src = write_image_folder(tmp_path / "src", count=60, classes=2, size=(120, 160))
    (src / "class_1" / "img_0031.jpg").write_bytes(b"broken")
    ref = tmp_path / "ref"
    pack_images(src, ref, run_options=RunOptions(workers=0, max_failures=1))
    out = tmp_path / "out"
    base = ["to-lmdb", src, out, "--commit-every", 4, "--max-failures", 1]
    assert run_and_kill(packer_cmd(*base, "--workers", 2), checkpoint_at_least(partial_path(out) / ".resume.json", 12))
    r = CliRunner().invoke(main, [str(a) for a in base] + ["--resume", "--executor", "ray", "--workers", "2"])
    assert r.exit_code == 0, r.output
    assert "59 samples from 60 inputs, 1 failed" in r.output
    assert packed_snapshot(out) == packed_snapshot(ref)
    assert (out / "data.mdb").read_bytes() != b""


@pytest.mark.slow
def test_cli_ray_address_joins_a_running_cluster(ray_cluster, tmp_path, image_folder):
    """``--ray-address`` connects a separate ``packer`` process to a running cluster (this test's)."""
    address = ray_cluster.get_runtime_context().gcs_address
    out = tmp_path / "o"
    done = subprocess.run(packer_cmd("-v", "to-lmdb", image_folder, out, "--executor", "ray",
                                     "--ray-address", address), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"on the cluster at {address} (2 CPUs)" in done.stderr
    ref = tmp_path / "ref"
    pack_images(image_folder, ref, run_options=RunOptions(workers=0))
    assert packed_snapshot(out) == packed_snapshot(ref)


@pytest.mark.slow
def test_decode_frames_on_ray_matches_local(ray_cluster, tmp_path):
    """decode-frames passes its per-video timeout: Ray runs one video per task, timed from its
    start, and the frames packed are the local run's."""
    from tests.support.inputs import write_video_folder
    from packer.commands.decode_frames import decode_frames

    src = write_video_folder(tmp_path / "videos", per_class=2, classes=2, frames=9)
    (src / "class_0" / "broken.mp4").write_bytes(b"not a video")
    local, on_ray = tmp_path / "local.lmdb", tmp_path / "ray.lmdb"
    decode_frames(src, local, to="lmdb", run_options=RunOptions(workers=2, max_failures=1, timeout=600.0))
    report = decode_frames(src, on_ray, to="lmdb",
                           run_options=RunOptions(workers=2, max_failures=1, executor="ray", timeout=60))
    assert report.failed == 1 and report.videos == 4
    assert packed_snapshot(on_ray) == packed_snapshot(local)
