"""``packer resize`` under faults. It mirrors a tree (no Writer, no --resume: the rerun is
incremental), so it has its own rows: SIGKILL at several points then a rerun ends identical to
an uninterrupted run with no temporary files; a file-size limit or a read-only output stops
with one error line naming the path; hostile inputs are recorded."""
from __future__ import annotations

import json
import stat

import pytest

from tests.support.faults import make_source
from tests.support.inputs import bomb_png
from tests.support.killing import packer_cmd, run_and_kill, run_packer
from tests.support.limits import file_size_limit, run_readonly


ARGS = ("--short-side", "24", "--workers", "0", "--max-failures", "9")


def tree(root):
    """Every output file by relative path (the failures file included), hidden ones too."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def src_and_reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("resize-faults")
    src = make_source("images", root / "src")
    ref = root / "ref"
    r = run_packer("resize", src, ref, *ARGS)
    assert r.returncode == 1 or r.returncode == 0, r.stderr
    return src, tree(ref)


def temporaries(out):
    return [p.name for p in out.rglob(".*.tmp-*")]


@pytest.mark.parametrize("outputs", [1, 10, pytest.param(20, marks=pytest.mark.slow)])
def test_killed_resize_reruns_to_the_same_tree(src_and_reference, tmp_path, outputs):
    src, reference = src_and_reference
    out = tmp_path / "out"

    def written() -> bool:
        return out.is_dir() and sum(1 for p in out.rglob("*.jpg")) >= outputs

    assert run_and_kill(packer_cmd("resize", src, out, *ARGS), written)
    run_packer("resize", src, out, *ARGS)
    assert tree(out) == reference and temporaries(out) == []


def test_file_size_limit_and_read_only_stop_with_one_line(src_and_reference, tmp_path):
    src, reference = src_and_reference
    out = tmp_path / "out"
    biggest = max(len(v) for v in reference.values())
    r = run_packer("resize", src, out, *ARGS, preexec_fn=file_size_limit(biggest // 2))
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert r.returncode == 1 and len(errors) == 1 and str(out) in errors[0], r.stderr
    assert "Traceback" not in r.stderr and temporaries(out) == []
    frozen = [p for p in [out, *out.rglob("*")] if p.is_dir()]
    for p in frozen:
        p.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        r = run_readonly(["resize", src, out, *ARGS])
    finally:
        for p in frozen:
            p.chmod(0o755)
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert r.returncode == 1 and len(errors) == 1 and str(out) in errors[0], r.stderr
    run_packer("resize", src, out, *ARGS)  # the space is back: the rerun completes
    assert tree(out) == reference and temporaries(out) == []


def test_bomb_and_symlink_loops_are_recorded(tmp_path):
    src = make_source("images", tmp_path / "src")
    bomb_png(src / "class_0" / "bomb.png")
    (src / "class_2" / "loop").symlink_to("..")
    (src / "class_2" / "self.jpg").symlink_to("self.jpg")
    r = run_packer("resize", src, tmp_path / "out", *ARGS)
    assert r.returncode == 0, r.stderr
    failed = {f["key"]: f["reason"] for f in map(json.loads, (tmp_path / "out" / "failures.jsonl").open())}
    assert set(failed) == {"class_0/bomb.png", "class_1/img_0013.jpg", "class_2/self.jpg"}
    assert "decompression bomb" in failed["class_0/bomb.png"]
