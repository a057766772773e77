"""No command ever deletes or reads its own output as input (docs/faults.md).

Every command that takes inputs and an output refuses an output that is, contains or lies inside
a tree it walks, however the two are spelled (``..``, a trailing ``/``, a symlink, relative or
absolute), before it touches anything: through the CLI and the library alike. ``--overwrite``
replaces only a packer output, and a walk leaves out any packer output found inside its tree.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

import packer
from packer.errors import UsageError
from tests.support.inputs import write_image_folder
from tests.support.killing import run_packer

# command -> (CLI argv before SRC OUT, the library call, the output's name, input kind)
COMMANDS = {
    "to-lmdb": (["to-lmdb"], lambda s, o, **kw: packer.pack(s, o, format="lmdb", workers=0, **kw), "out.lmdb"),
    "to-records": (["to-records"], lambda s, o, **kw: packer.pack(s, o, format="records", workers=0, **kw),
                   "out.records"),
    "to-hdf5": (["to-hdf5"], lambda s, o, **kw: packer.pack(s, o, format="hdf5", workers=0, **kw), "out.h5"),
    "decode-frames": (["decode-frames"], lambda s, o, **kw: packer.decode_frames(s, o, workers=0, **kw), "frames"),
    "pack-videos": (["pack-videos", "--to", "files"],
                    lambda s, o, **kw: packer.pack_videos(s, o, to="files", workers=0, **kw), "videos"),
    "resize": (["resize", "--short-side", "16"],
               lambda s, o, **kw: packer.resize(s, o, packer.ResizeSpec(short_side=16), workers=0), "small"),
    "merge": (["merge"], lambda s, o, **kw: packer.merge([s], o, **kw), "merged.lmdb"),
}
OVERWRITES = {"to-lmdb", "to-records", "to-hdf5", "decode-frames", "pack-videos", "merge"}


def _tree_digest(root: Path) -> dict[str, str]:
    """Every file below ``root`` (links not followed) and its bytes' digest."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """An image tree, and a complete LMDB pack of it (a merge's part); read-only."""
    root = tmp_path_factory.mktemp("placement")
    images = write_image_folder(root / "images", count=4, classes=2, size=(20, 24))
    packer.pack(images, root / "part.lmdb", workers=0)
    return {"images": images, "part": root / "part.lmdb"}


def _layout(relation: str, command: str, inputs: dict[str, Path], tmp: Path) -> tuple[str, str]:
    """``(SRC, OUT)`` as spelled on the command line for ``relation`` between them."""
    name = COMMANDS[command][2]
    source = inputs["part"] if command == "merge" else inputs["images"]
    src = tmp / "src"
    shutil.copytree(source, src, symlinks=True)
    if relation == "same":
        return str(src), str(src)
    if relation == "same-trailing-slash":
        return str(src) + "/", str(src)
    if relation == "out-inside":
        return str(src), str(src / "class_0" / name)
    if relation == "out-inside-dotdot":  # another spelling of a path inside SRC
        (tmp / "elsewhere").mkdir()
        return str(tmp / "elsewhere" / ".." / "src"), str(src / "sub" / ".." / name)
    if relation == "out-inside-symlink":  # OUT inside SRC, reached through a symlink to SRC
        os.symlink(src, tmp / "link")
        return str(src), str(tmp / "link" / name)
    if relation == "src-inside-out":  # SRC inside an earlier output, replaced by --overwrite
        out = tmp / name
        out.mkdir()
        (out / "packer.json").write_text('{"format": "lmdb"}')
        shutil.move(str(src), out / "inputs")
        return str(out / "inputs"), str(out)
    if relation == "relative":  # OUT relative to the working folder, SRC absolute
        return str(src), os.path.relpath(src / name)
    raise AssertionError(relation)


RELATIONS = ["same", "same-trailing-slash", "out-inside", "out-inside-dotdot", "out-inside-symlink",
             "src-inside-out", "relative"]


@pytest.mark.parametrize("command,relation", [(c, r) for c in COMMANDS for r in RELATIONS
                                               if (c, r) != ("to-hdf5", "src-inside-out")])  # a file holds no input
def test_an_output_on_its_own_input_is_refused_before_anything_is_touched(command, relation, inputs, tmp_path):
    src, out = _layout(relation, command, inputs, tmp_path)
    before = _tree_digest(tmp_path)
    argv, call, _ = COMMANDS[command]
    extra = ["--overwrite"] if command in OVERWRITES else []
    r = run_packer(*argv, src, out, *extra, "--workers", 0) if command != "merge" else \
        run_packer(*argv, src, out, *extra)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "refusing an output that" in r.stderr and "the input" in r.stderr, r.stderr
    with pytest.raises(UsageError, match="refusing an output that"):
        call(src, out, **({"overwrite": True} if command in OVERWRITES else {}))
    assert _tree_digest(tmp_path) == before  # nothing deleted, nothing written (not even OUT.lock)


def test_the_reported_case_keeps_the_input(inputs, tmp_path):
    """The issue's case: a copy of the images inside an LMDB output, packed over it."""
    out = tmp_path / "out.lmdb"
    packer.pack(inputs["images"], out, workers=0)
    shutil.copytree(inputs["images"], out / "photos")
    r = run_packer("to-lmdb", out / "photos", out, "--overwrite", "--workers", 0)
    assert r.returncode == 1 and "refusing an output that contains the input" in r.stderr
    assert sorted(p.name for p in (out / "photos").iterdir()) == ["class_0", "class_1"]


def test_a_list_names_its_inputs_so_its_root_may_hold_the_output(inputs, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(inputs["images"], root)
    (root / "train.txt").write_text("class_0/img_0000.jpg 0\nclass_1/img_0001.jpg 1\n")
    report = packer.pack(root, root / "train.lmdb", list_path=root / "train.txt", workers=0)
    assert report.count == 2
    # ... but the list itself may not lie inside the output it would replace
    (root / "train.lmdb" / "train.txt").write_text("class_0/img_0000.jpg 0\n")
    with pytest.raises(UsageError, match="refusing an output that contains the input"):
        packer.pack(root, root / "train.lmdb", list_path=root / "train.lmdb" / "train.txt", overwrite=True)
    # and a list written by decode-frames may not be the list it reads
    with pytest.raises(UsageError, match="refusing an output that is the input"):
        packer.decode_frames(root, tmp_path / "fr", list_path=root / "train.txt", list_out=root / "train.txt")


@pytest.mark.parametrize("what", ["file", "folder"])
def test_overwrite_replaces_only_a_packer_output(what, inputs, tmp_path):
    out = tmp_path / ("out.h5" if what == "file" else "out.lmdb")
    if what == "file":
        out.write_bytes(b"someone's own data")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("someone's own data")
    fmt = "hdf5" if what == "file" else "lmdb"
    r = run_packer(f"to-{fmt}", inputs["images"], out, "--overwrite", "--workers", 0)
    assert r.returncode == 1 and "is not a packer output; refusing to overwrite it" in r.stderr
    assert (out.read_bytes() if what == "file" else (out / "notes.txt").read_bytes()) == b"someone's own data"
    # a packer output, even one whose manifest is damaged, is replaced
    out.unlink() if what == "file" else shutil.rmtree(out)
    packer.pack(inputs["images"], out, format=fmt, workers=0)
    if what == "folder":
        manifest = out / "packer.json"
        manifest.write_text(manifest.read_text().replace('"count": 4', '"count": 5'))
    assert packer.pack(inputs["images"], out, format=fmt, workers=0, overwrite=True).count == 4


def test_a_walk_leaves_out_packer_outputs_inside_its_tree(inputs, tmp_path):
    """Outputs put inside a tree before this check existed (or by hand) are never read as input."""
    src = tmp_path / "src"
    shutil.copytree(inputs["images"], src)
    shutil.copytree(inputs["part"], src / "old.lmdb")  # a finished output beside the classes
    shutil.copytree(src / "class_0", src / "class_1" / "fr.partial")  # an interrupted one in a class
    (src / "class_1" / "fr.partial" / ".run-token").write_text("{}")
    report = packer.pack(src, tmp_path / "o.lmdb", workers=0)
    ds = packer.PackedDataset(tmp_path / "o.lmdb")
    assert report.count == 4 and ds.classes == ["class_0", "class_1"]
    assert all("partial" not in k for k in ds.keys)


def test_an_annotation_file_or_manifest_is_an_input_too(inputs, tmp_path):
    """A COCO file or a manifest names its images (the root is not walked, so the output may lie
    inside it), but an output replaced by --overwrite may not hold the file itself."""
    root = tmp_path / "data"
    shutil.copytree(inputs["images"], root)
    out = root / "fields.lmdb"
    out.mkdir()
    (out / "packer.json").write_text('{"format": "lmdb"}')
    (out / "samples.jsonl").write_text('{"image": "class_0/img_0000.jpg", "caption": "a"}\n')
    for source in ({"manifest": out / "samples.jsonl"}, {"coco": out / "samples.jsonl"}):
        with pytest.raises(UsageError, match="refusing an output that contains the input"):
            packer.pack(root, out, overwrite=True, workers=0, **source)
    (root / "samples.jsonl").write_text('{"image": "class_0/img_0000.jpg", "caption": "a"}\n')
    assert packer.pack(root, root / "captions.lmdb", manifest=root / "samples.jsonl", workers=0).count == 1
