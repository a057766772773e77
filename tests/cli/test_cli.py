"""The command line, driven through click's CliRunner."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from PIL import Image

from packer import __version__
from packer.cli import main


@pytest.fixture
def runner():
    return CliRunner()


def test_help_lists_commands_and_version(runner):
    r = runner.invoke(main, ["--help"])
    assert r.exit_code == 0
    for cmd in ("to-lmdb", "inspect", "verify", "demo"):
        assert cmd in r.output
    r = runner.invoke(main, ["--version"])
    assert r.exit_code == 0 and __version__ in r.output
    for cmd in main.commands:
        assert runner.invoke(main, [cmd, "--help"]).exit_code == 0


def test_to_lmdb_inspect_verify(runner, image_folder, tmp_path):
    out = tmp_path / "o.lmdb"
    r = runner.invoke(main, ["to-lmdb", str(image_folder), str(out), "--workers", "2"])
    assert r.exit_code == 0, r.output
    assert "24 samples" in r.output and "0 failed" in r.output
    r = runner.invoke(main, ["inspect", str(out), "--json", "--grid", str(tmp_path / "g.png")])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["format"] == "lmdb" and info["count"] == 24 and len(info["classes"]) == 3
    assert info["samples"][0]["key"] == "class_0/img_0000.jpg" and info["bytes_on_disk"] > 0
    grid = Image.open(tmp_path / "g.png")
    assert grid.width >= 4 * 100 and len(info["grid"]["positions"]) == 16
    r = runner.invoke(main, ["inspect", str(out)])
    assert r.exit_code == 0 and "24 samples" in r.output and "class_0/img_0000.jpg" in r.output
    r = runner.invoke(main, ["verify", str(out)])
    assert r.exit_code == 0 and "OK (24 samples checked)" in r.output


def test_failures_exit_status(runner, mixed_folder, tmp_path):
    out = tmp_path / "o.lmdb"
    r = runner.invoke(main, ["to-lmdb", str(mixed_folder), str(out)])
    assert r.exit_code == 1
    assert "3 inputs failed" in r.output and "truncated.jpg" in r.output
    assert out.exists()  # every good sample is packed anyway
    out2 = tmp_path / "o2.lmdb"
    r = runner.invoke(main, ["to-lmdb", str(mixed_folder), str(out2), "--max-failures", "3"])
    assert r.exit_code == 0


def test_existing_output_refused_before_work(runner, image_folder, tmp_path):
    out = tmp_path / "o.lmdb"
    assert runner.invoke(main, ["to-lmdb", str(image_folder), str(out)]).exit_code == 0
    r = runner.invoke(main, ["to-lmdb", str(image_folder), str(out)])
    assert r.exit_code == 1 and "already exists" in r.output and "--overwrite" in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = runner.invoke(main, ["to-lmdb", str(image_folder), str(out), "--overwrite"])
    assert r.exit_code == 0
    r = runner.invoke(main, ["to-lmdb", str(image_folder), str(out), "--overwrite", "--resume"])
    assert r.exit_code == 1 and "exclude" in r.output


def test_overwrite_never_deletes_a_foreign_folder(runner, image_folder, tmp_path):
    foreign = tmp_path / "precious"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    r = runner.invoke(main, ["to-lmdb", str(image_folder), str(foreign), "--overwrite"])
    assert r.exit_code == 1 and "not a packer output" in r.output
    assert (foreign / "thesis.tex").exists()


def test_list_file_with_root(runner, image_folder, tmp_path):
    lst = tmp_path / "train.txt"
    lst.write_text("class_2/img_0002.jpg 5\nclass_0/img_0000.jpg 1\n")
    out = tmp_path / "l.lmdb"
    r = runner.invoke(main, ["to-lmdb", "--list", str(lst), "--root", str(image_folder), str(out)])
    assert r.exit_code == 0, r.output
    from packer import PackedDataset

    ds = PackedDataset(out, decode="bytes")
    assert ds.keys == ["class_2/img_0002.jpg", "class_0/img_0000.jpg"]
    assert [ds[i][1] for i in range(2)] == [5, 1] and len(ds.classes) == 6


@pytest.mark.parametrize("args,msg", [
    (["to-lmdb", "/nonexistent/src", "OUT"], "does not exist"),
    (["to-lmdb", "SRC", "OUT", "--check", "maybe"], "Invalid value"),
    (["inspect", "/nonexistent"], "does not exist"),
])
def test_bad_arguments_one_line(runner, args, msg, tmp_path):
    args = [a.replace("OUT", str(tmp_path / "o")).replace("SRC", str(tmp_path)) for a in args]
    r = runner.invoke(main, args)
    assert r.exit_code != 0 and msg in r.output


def test_verify_a_non_dataset(runner, tmp_path):
    r = runner.invoke(main, ["verify", str(tmp_path)])
    assert r.exit_code == 1 and "not a packed dataset" in r.output


def test_demo(runner, tmp_path):
    r = runner.invoke(main, ["demo", str(tmp_path / "d"), "--count", "12", "--workers", "0"])
    assert r.exit_code == 0, r.output
    assert "12 samples" in r.output and "samples/s" in r.output
    assert (tmp_path / "d" / "images.lmdb" / "data.mdb").exists()


@pytest.mark.parametrize("given, wanted", [(None, "1"), ("3", "3")])
def test_cli_keeps_openblas_to_one_thread_unless_told(given: str | None, wanted: str) -> None:
    """The CLI sets OpenBLAS to one thread before numpy loads (its threads spin at import, and no
    command uses BLAS); a value the user set is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    code = ("import os, sys, packer.cli; assert 'numpy' in sys.modules; "  # (the commands loaded it)
            "print(os.environ['OPENBLAS_NUM_THREADS'])")
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == wanted
