"""``--append`` to video outputs: ``decode-frames`` (frame folders, LMDB, HDF5, records) and
``pack-videos`` (records, LMDB, HDF5, video files) grow by the videos they lack and read exactly
like one run over all of them, sample for sample and clip for clip; the stored bytes of the
videos there stay as they were; each append is a version a reader keeps; what an append may
not change is refused, naming it."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.errors import UsageError
from packer.formats import open_reader
from packer.synth import write_video
from tests.conversion.test_append import stored_hashes as image_hashes
from tests.support.inputs import write_image_folder, write_video_folder

SIZE = (32, 40)
# (command, --to); the slow ones re-encode or write one more kind of the same storage
CASES = [("decode-frames", "frames"), ("decode-frames", "lmdb"), ("pack-videos", "records"),
         pytest.param(("decode-frames", "records"), marks=pytest.mark.slow),
         pytest.param(("decode-frames", "hdf5"), marks=pytest.mark.slow),
         pytest.param(("pack-videos", "lmdb"), marks=pytest.mark.slow),
         pytest.param(("pack-videos", "hdf5"), marks=pytest.mark.slow),
         pytest.param(("pack-videos", "files"), marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, Path]:
    """``old``: 4 tiny videos in 2 classes; ``late``: one more in ``class_1`` (sorts after its
    videos) and one of a new class ``class_2``; kept apart so each test copies what it needs."""
    root = tmp_path_factory.mktemp("append-videos")
    old = write_video_folder(root / "old", per_class=2, classes=2, frames=5, size=SIZE)
    write_video(root / "late" / "class_1" / "clip_1_9.mp4", frames=6, size=SIZE, seed=91)
    write_video(root / "late" / "class_2" / "clip_2_0.mp4", frames=4, size=SIZE, seed=92)
    return {"old": old, "late": root / "late"}


def fresh(tmp_path: Path, trees: dict[str, Path]) -> Path:
    src = tmp_path / "src"
    shutil.copytree(trees["old"], src, copy_function=shutil.copy2)
    return src


def grow(src: Path, trees: dict[str, Path]) -> None:
    shutil.copytree(trees["late"], src, copy_function=shutil.copy2, dirs_exist_ok=True)


def convert(cmd: str, src: Path, out: Path, to: str, **kw):
    if cmd == "decode-frames":
        return packer.decode_frames(src, out, to=to, workers=0, **kw)
    return packer.pack_videos(src, out, to=to, workers=0, short_side=None, gop=4, **kw)


def out_path(root: Path, to: str, name: str = "out") -> Path:
    return root / (f"{name}.h5" if to == "hdf5" else f"{name}.{to}")


def samples(path: Path, **kw) -> list[tuple]:
    r = open_reader(path, **kw)
    try:
        return [(k, bytes(rec.data), rec.label, rec.fmt, rec.height, rec.width, rec.channels, sample.extra)
                for k, rec, sample in zip(r.keys, (r.read(i) for i in range(len(r))),
                                          (r.sample(i) for i in range(len(r))))]
    finally:
        r.close()


def stored_hashes(out: Path, to: str) -> dict[str, str]:
    """sha256 of what holds each stored sample: LMDB values, records shards, the HDF5 file, frame
    and video files (the sidecars, which grow, left out)."""
    if to in ("lmdb", "records"):
        return image_hashes(out, to)
    if to == "hdf5":
        return {"v1": hashlib.sha256(out.read_bytes()).hexdigest()}
    files = [p for p in out.rglob("*") if p.is_file() and p.parent != out]
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
            if "versions" not in p.parts}


def clips(path: Path, **kw) -> list[tuple]:
    ds = packer.PackedVideoDataset(path, clip_len=2, num_clips=2, test_mode=True, **kw)
    return [(key, ds[i][0].numpy().tobytes(), ds[i][1]) for i, key in enumerate(ds.keys)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_a_video_append_reads_like_one_run_and_keeps_the_stored_bytes(case, trees, tmp_path):
    cmd, to = case
    src = fresh(tmp_path, trees)
    out, ref = out_path(tmp_path, to), out_path(tmp_path, to, "ref")
    convert(cmd, src, out, to)
    before, first, first_clips = stored_hashes(out, to), samples(out), clips(out)
    grow(src, trees)
    report = convert(cmd, src, out, to, append=True)
    assert report.status == "appended" and report.version == 2 and report.videos == 6
    assert "1 new classes (class_2) labelled from 2" in report.summary()
    convert(cmd, src, ref, to)
    assert samples(out) == samples(ref)  # keys, bytes, labels, shapes, video_index / frame extras
    new, one = open_reader(out).manifest, open_reader(ref).manifest
    assert new.videos == one.videos and new.classes == one.classes == ["class_0", "class_1", "class_2"]
    assert clips(out) == clips(ref)
    if to == "hdf5":  # the first version's file is the first part, untouched
        assert {"v1": hashlib.sha256((out.with_name(out.name + ".parts") / "v1.h5").read_bytes()).hexdigest()} \
            == before
    else:
        after = stored_hashes(out, to)
        assert {k: after[k] for k in before} == before
    assert samples(out, version=1) == first and clips(out, version=1) == first_clips
    assert packer.verify(out).ok
    assert convert(cmd, src, out, to, append=True).status == "current"


def test_frame_folders_grow_in_place_and_frame_dataset_reads_each_version(trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = tmp_path / "frames"
    convert("decode-frames", src, out, "frames")
    kw = dict(clip_len=1, num_clips=3, test_mode=True)
    old = packer.FrameDataset(out, **kw)
    first = [(old[i][0].numpy().tobytes(), old[i][1]) for i in range(len(old))]
    grow(src, trees)
    convert("decode-frames", src, out, "frames", append=True)
    assert (out / "class_2" / "clip_2_0").is_dir() and not out.with_name("frames.partial").exists()
    assert len(old) == 4 and [(old[i][0].numpy().tobytes(), old[i][1]) for i in range(4)] == first
    now = packer.FrameDataset(out, **kw)
    assert len(now) == 6 and [now[i][1] for i in range(6)] == [0, 0, 1, 1, 1, 2]
    pinned = packer.FrameDataset(out, version=1, **kw)
    assert [(pinned[i][0].numpy().tobytes(), pinned[i][1]) for i in range(len(pinned))] == first
    assert (out / "rawframes.txt").read_text().splitlines()[-1] == "class_2/clip_2_0 4 2"


@pytest.mark.parametrize("to", ["lmdb", pytest.param("frames", marks=pytest.mark.slow)])
def test_prune_leaves_out_the_gone_videos(to, trees, tmp_path):
    src = fresh(tmp_path, trees)
    out, ref = out_path(tmp_path, to), out_path(tmp_path, to, "ref")
    convert("decode-frames", src, out, to)
    first = samples(out)
    (src / "class_0" / "clip_0_0.mp4").unlink()
    grow(src, trees)
    kept = convert("decode-frames", src, out, to, append=True)
    assert "1 stored inputs gone, kept (--prune leaves them out), e.g. class_0/clip_0_0" in kept.summary()
    assert kept.videos == 6
    pruned = convert("decode-frames", src, out, to, append=True, prune=True)
    assert pruned.version == 3 and pruned.videos == 5
    convert("decode-frames", src, ref, to)
    assert sorted(clips(out)) == sorted(clips(ref))  # the videos there now, as one run over them
    assert [s[:7] for s in samples(out)] == [s[:7] for s in samples(ref)]
    assert samples(out, version=1) == first and len(packer.PackedVideoDataset(out, version=2)) == 6
    assert packer.verify(out).ok


def test_what_an_append_may_not_change_is_refused(trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = tmp_path / "out.lmdb"
    convert("decode-frames", src, out, "lmdb", short_side=24)
    grow(src, trees)
    with pytest.raises(UsageError, match=r"--short-side: 24 -> 16"):
        convert("decode-frames", src, out, "lmdb", short_side=16, append=True)
    with pytest.raises(UsageError, match=r"holds video frames \(decode-frames\), not videos \(pack-videos\)"):
        convert("pack-videos", src, out, "lmdb", append=True)
    with pytest.raises(UsageError, match=r"is a lmdb output; append to it with decode-frames --to lmdb"):
        packer.decode_frames(src, out, to="records", workers=0, short_side=24, append=True)
    assert len(open_reader(out).manifest.videos) == 4
    images = tmp_path / "images.lmdb"
    packer.pack(write_image_folder(tmp_path / "imgs", count=4, classes=2), images, workers=0)
    with pytest.raises(UsageError, match=r"holds images, not video frames \(decode-frames\); append to it with to-lmdb"):
        convert("decode-frames", src, images, "lmdb", append=True)


def test_a_changed_video_is_not_packed_over_its_frame_folder(trees, tmp_path):
    """Frame folders store a video under its name, which version 1 still reads: --prune of a
    changed video is refused naming it, the output untouched."""
    src = fresh(tmp_path, trees)
    out = tmp_path / "frames"
    convert("decode-frames", src, out, "frames")
    write_video(src / "class_0" / "clip_0_0.mp4", frames=7, size=SIZE, seed=55)
    with pytest.raises(UsageError, match=r"e\.g\. class_0/clip_0_0: a video --prune left out, or one that changed"):
        convert("decode-frames", src, out, "frames", append=True, prune=True)
    assert open_reader(out).version == 1 and packer.verify(out).ok


def test_a_video_dataset_opened_before_an_append_keeps_its_version(trees, tmp_path):
    src = fresh(tmp_path, trees)
    out = tmp_path / "out.records"
    convert("pack-videos", src, out, "records")
    ds = packer.PackedVideoDataset(out, clip_len=2, num_clips=1, test_mode=True)
    first = [ds[i][0].numpy() for i in range(len(ds))]
    grow(src, trees)
    convert("pack-videos", src, out, "records", append=True)
    assert len(ds) == 4 and all(np.array_equal(ds[i][0].numpy(), first[i]) for i in range(4))
    assert len(packer.PackedVideoDataset(out, clip_len=2)) == 6


SPLIT_CASES = [("decode-frames", "lmdb"), ("pack-videos", "records"), ("decode-frames", "frames"),
               pytest.param(("pack-videos", "files"), marks=pytest.mark.slow),
               pytest.param(("decode-frames", "hdf5"), marks=pytest.mark.slow)]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: "-".join(c))
def test_a_split_video_append_reads_like_one_append(case, trees, tmp_path):
    """The new videos split across 2 jobs (``append_to``; decode-frames' part 0 through the CLI) and added with
    ``merge --append``: sample for sample, video entry for video entry and clip for clip what
    one ``--append`` gives, version 1 kept."""
    from click.testing import CliRunner

    from packer.cli import main

    cmd, to = case
    src = fresh(tmp_path, trees)
    out, ref = out_path(tmp_path, to), out_path(tmp_path, to, "ref")
    convert(cmd, src, out, to)
    convert(cmd, src, ref, to)
    first = samples(out)
    grow(src, trees)
    convert(cmd, src, ref, to, append=True)
    parts = [out_path(tmp_path, to, f"part{i}") for i in range(2)]
    if cmd == "decode-frames":  # (pack-videos' CLI always resizes: convert() keeps the size)
        r = CliRunner().invoke(main, [cmd, str(src), str(parts[0]), "--to", to, "--workers", "0", "--append-to",
                                      str(out), "--num-shards", "2", "--shard-index", "0"])
        assert r.exit_code == 0, r.output
    else:
        convert(cmd, src, parts[0], to, append_to=out, num_shards=2, shard_index=0)
    convert(cmd, src, parts[1], to, append_to=out, num_shards=2, shard_index=1)
    assert [[v["key"] for v in open_reader(p).manifest.videos] for p in parts] == [["class_1/clip_1_9.mp4"],
                                                                             ["class_2/clip_2_0.mp4"]]
    report = packer.merge(parts, out, append=True)
    assert report.version == 2 and report.videos == 6
    assert samples(out) == samples(ref)
    assert open_reader(out).manifest.videos == open_reader(ref).manifest.videos
    assert open_reader(out).classes == open_reader(ref).classes == ["class_0", "class_1", "class_2"]
    assert clips(out) == clips(ref) and samples(out, version=1) == first
    assert packer.verify(out).ok
    assert convert(cmd, src, out, to, append=True).status == "current"


def test_a_merged_video_records_output_keeps_its_layout_and_takes_an_append(trees, tmp_path):
    """A video run's records shards follow its commit size: a merge of its parts keeps that
    layout and records it, so an ``--append`` to the merged output is not refused for it."""
    src = fresh(tmp_path, trees)
    parts = [out_path(tmp_path, "records", f"part{i}") for i in range(2)]
    for i, part in enumerate(parts):
        convert("pack-videos", src, part, "records", num_shards=2, shard_index=i, commit_every=1)
    out = out_path(tmp_path, "records")
    packer.merge(parts, out)
    assert open_reader(out).manifest.created_by["options"]["samples_per_shard"] == 1
    assert len(open_reader(out).manifest.shards) == 4
    grow(src, trees)
    report = convert("pack-videos", src, out, "records", append=True, commit_every=1)
    assert report.status == "appended" and report.videos == 6 and packer.verify(out).ok

