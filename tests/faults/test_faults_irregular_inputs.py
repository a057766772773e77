"""Only regular files are inputs (issue 31, case 6): a named pipe, a unix socket, a device or a
symlink to one, in a tree or named by a list, is a recorded failure, never a read that waits
forever; and every whole-file read has a size cap (``PACKER_MAX_INPUT_BYTES``), refusing a
bigger file as a recorded failure. For every image format (also ``--check full`` and pool
workers), ``packer resize`` and ``decode-frames``. Each packer run is a subprocess with a
deadline, and each test has a pytest timeout: a regression fails instead of hanging."""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.inputs import write_image_folder, write_video_folder
from tests.support.killing import packer_env, run_packer
from scripts.timing import scaled
from packer.formats import FORMATS

pytestmark = pytest.mark.timeout(240)

DEADLINE = 90  # seconds one packer command may take on an idle machine (each takes a few; scaled)


def run(*args, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``packer ARGS`` in a process of its own; a hang past DEADLINE is a failure, not a stuck suite."""
    try:
        return run_packer(*args, timeout=scaled(DEADLINE), env=env)
    except subprocess.TimeoutExpired:  # run_packer has killed its process group
        pytest.fail(f"packer {' '.join(map(str, args))} hung (killed after {DEADLINE}s)")


def failures(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def failures_of(out: Path) -> list[dict]:
    """The failure records of a packed output (folder or single file) or a resize mirror."""
    side = out.with_name(out.name + ".failures.jsonl")
    return failures(side if side.exists() else out / "failures.jsonl")


def add_specials(folder: Path, ext: str) -> dict[str, str]:
    """A FIFO, a listening unix socket, a symlink to a FIFO and a symlink to /dev/null (a
    character device) in ``folder``, each named like an input; name -> what it is."""
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / f"pipe.{ext}")
    os.mkfifo(folder / f".target_pipe")  # hidden: not an input itself, only through the link
    (folder / f"link_to_pipe.{ext}").symlink_to(folder / ".target_pipe")
    (folder / f"device.{ext}").symlink_to("/dev/null")
    sock = socket.socket(socket.AF_UNIX)
    path = folder / f"sock.{ext}"
    if len(str(path)) < 100:  # (AF_UNIX paths are short)
        sock.bind(str(path))
    sock.close()  # the socket file stays
    found = {f"pipe.{ext}": "named pipe", f"link_to_pipe.{ext}": "symlink to a named pipe",
             f"device.{ext}": "character device"}
    if path.exists():
        found[f"sock.{ext}"] = "socket"
    return found


@pytest.fixture()
def tree(tmp_path) -> tuple[Path, dict[str, str]]:
    src = write_image_folder(tmp_path / "src", count=6, classes=2, size=(24, 32))
    return src, add_specials(src / "class_0", "jpg")


def assert_recorded(records: list[dict], specials: dict[str, str]) -> None:
    for name, kind in specials.items():
        hits = [r for r in records if name in ((r.get("key") or "").rsplit("/", 1)[-1],
                                               r.get("source", "").rsplit("/", 1)[-1])]
        if hits and hits[0]["stage"] == "read":  # (a read sees the open file: a link is followed)
            kind = kind.removeprefix("symlink to a ")
        assert len(hits) == 1 and kind in hits[0]["reason"], (name, records)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("extra", [(), ("--check", "full"), ("--workers", "2")],
                         ids=["inline", "check-full", "workers-2"])
def test_special_files_in_a_tree_are_recorded_not_read(tree, tmp_path, fmt, extra):
    src, specials = tree
    out = tmp_path / ("out.h5" if FORMATS[fmt][0].single_file else "out")
    workers = () if "--workers" in extra else ("--workers", "0")
    r = run(f"to-{fmt}", src, out, *workers, *extra, "--max-failures", "9")
    assert r.returncode == 0, r.stderr
    records = failures_of(out)
    assert_recorded(records, specials)
    assert all(rec["stage"] == "input" for rec in records) and len(records) == len(specials)
    assert f"6 samples" in r.stdout + r.stderr


def test_special_files_named_by_a_list_are_recorded_not_read(tree, tmp_path):
    src, specials = tree
    lst = tmp_path / "list.txt"
    lst.write_text("".join(f"class_0/{name} 0\n" for name in specials) + "class_1/img_0001.jpg 1\n")
    out = tmp_path / "out"
    r = run("to-lmdb", src, out, "--list", lst, "--workers", "0", "--max-failures", "9")
    assert r.returncode == 0, r.stderr
    records = failures_of(out)
    assert_recorded(records, specials)
    assert all(rec["stage"] == "read" for rec in records)


def test_resize_records_special_files_in_a_tree_and_a_list(tree, tmp_path):
    src, specials = tree
    r = run("resize", src, tmp_path / "mirror", "--short-side", "16", "--workers", "0", "--max-failures", "9")
    assert r.returncode == 0, r.stderr
    assert_recorded(failures_of(tmp_path / "mirror"), specials)
    lst = tmp_path / "list.txt"
    lst.write_text("".join(f"class_0/{name} 0\n" for name in specials))
    r = run("resize", src, tmp_path / "mirror2", "--list", lst, "--short-side", "16", "--workers", "0",
            "--max-failures", "9")
    assert_recorded(failures_of(tmp_path / "mirror2"), specials)


@pytest.mark.parametrize("to", ["frames", "lmdb"])
def test_decode_frames_records_special_files_in_a_tree_and_a_list(tmp_path, to):
    src = write_video_folder(tmp_path / "src", per_class=1, classes=2, frames=6, size=(24, 32))
    specials = add_specials(src / "class_0", "mp4")
    r = run("decode-frames", src, tmp_path / "out", "--to", to, "--max-frames", "2", "--workers", "0",
            "--max-failures", "9")
    assert r.returncode == 0, r.stderr
    assert_recorded(failures_of(tmp_path / "out"), specials)
    lst = tmp_path / "list.txt"
    lst.write_text("".join(f"class_0/{name} 0\n" for name in specials) + "class_1/clip_1_0.mp4 1\n")
    r = run("decode-frames", src, tmp_path / "out2", "--list", lst, "--to", to, "--max-frames", "2",
            "--workers", "0", "--max-failures", "9", "--timeout", "60")
    assert r.returncode == 0, r.stderr
    assert_recorded(failures_of(tmp_path / "out2"), specials)


def test_a_file_over_the_size_cap_is_a_recorded_failure(tmp_path):
    """``PACKER_MAX_INPUT_BYTES``: a bigger input is refused before it is read, recorded with
    its size; the rest are packed. (A real image is far below the 1 GiB default.)"""
    src = write_image_folder(tmp_path / "src", count=4, classes=2, size=(24, 32))
    big = src / "class_0" / "big.jpg"
    big.write_bytes((src / "class_0" / "img_0000.jpg").read_bytes() + b"\0" * 50_000)
    env = packer_env(PACKER_MAX_INPUT_BYTES="40000")
    for cmd, out in (("to-lmdb", tmp_path / "out"), ("resize", tmp_path / "mirror")):
        extra = ("--short-side", "16") if cmd == "resize" else ()
        r = run(cmd, src, out, *extra, "--workers", "0", "--max-failures", "9", env=env)
        assert r.returncode == 0, r.stderr
        records = failures_of(out)
        assert len(records) == 1 and records[0]["key"].endswith("big.jpg"), records
        assert "cap on one input" in records[0]["reason"] and str(big.stat().st_size) in records[0]["reason"]


def test_special_files_not_named_as_inputs_are_left_out_quietly(tmp_path):
    """A pipe or socket whose name has none of the extensions taken is no input, as any such
    file: left out without a failure (a FIFO named ``control`` beside the images)."""
    src = write_image_folder(tmp_path / "src", count=4, classes=2, size=(24, 32))
    os.mkfifo(src / "class_0" / "control")
    os.mkfifo(src / "class_1" / "pipe.txt")
    r = run("to-lmdb", src, tmp_path / "out", "--workers", "0")
    assert r.returncode == 0 and failures_of(tmp_path / "out") == [], r.stderr
