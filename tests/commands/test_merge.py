"""``packer merge``: parts of a ``--num-shards`` conversion merge into what one run writes, for
every registered format; parts that do not belong together are refused with one clear line."""
from __future__ import annotations

import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer import formats
from packer.cli import main
from packer.conversion.runner import WorkResult, run
from packer.errors import UsageError
from packer.formats import FORMATS, open_reader
from packer.formats.sample import Sample
from packer.formats.sidecars import partial_path
from packer.manifest import created_by
from packer.commands.merge import merge_parts, part_of
from packer.commands.pack_images import ImageJob, pack_images
from packer.conversion.inputs import image_folder as list_image_folder
from packer.conversion.inputs import partition
from packer.conversion.options import InputOptions, RunOptions
from tests.support.inputs import write_image_folder
from tests.support.killing import checkpoint_at_least, packer_cmd, run_and_kill
from tests.support.outputs import packed_snapshot

IMAGE_FORMATS = sorted(FORMATS)
# Video-only outputs (decode-frames' frame folders) merge too, where the registry has them.
ALL_FORMATS = {**FORMATS, **getattr(formats, "VIDEO_FORMATS", {})}


def out_path(base: Path, fmt: str, name: str = "out") -> Path:
    base.mkdir(parents=True, exist_ok=True)
    return base / (f"{name}.h5" if ALL_FORMATS[fmt][0].single_file else name)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """25 images in 3 classes with bad inputs in the first and middle parts."""
    root = write_image_folder(tmp_path_factory.mktemp("merge") / "src", count=22, classes=3)
    good = (root / "class_0" / "img_0000.jpg").read_bytes()
    (root / "class_0" / "img_0001_truncated.jpg").write_bytes(good[: len(good) // 3])
    (root / "class_1" / "zero.jpg").write_bytes(b"")
    (root / "class_2" / "text.jpg").write_text("not an image\n")
    return root


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
@pytest.mark.parametrize("num_shards", [3, 30])  # 30 > inputs: some parts are empty
def test_merge_equals_single_run(src, tmp_path, fmt, num_shards):
    single = out_path(tmp_path, fmt, "single")
    pack_images(src, single, format=fmt, run_options=RunOptions(workers=0, max_failures=3))
    parts = []
    for i in range(num_shards):
        part = out_path(tmp_path / "parts", fmt, f"part-{i}")
        pack_images(src, part, format=fmt, input_options=InputOptions(num_shards=num_shards, shard_index=i),
                    run_options=RunOptions(workers=0, max_failures=3))
        assert part_of(open_reader(part)) == (i, num_shards)  # each part says which it is
        parts.append(part)
    random.Random(num_shards).shuffle(parts)  # given in any order: sorted by shard index
    merged = out_path(tmp_path, fmt, "merged")
    report = merge_parts(parts, merged)
    assert report.count == 22 and report.failures == 3 and report.parts == num_shards
    assert packed_snapshot(merged) == packed_snapshot(single)
    assert not partial_path(merged).exists()


@pytest.mark.parametrize("fmt", [f for f in IMAGE_FORMATS if not FORMATS[f][0].single_file])
def test_merged_files_byte_identical_with_same_commits(src, tmp_path, fmt):
    """With the same commit batches the merged data files equal a single run's byte for byte
    (directory formats: a single-file format carries its manifest, created_by and all, inside)."""
    single = out_path(tmp_path, fmt, "single")
    pack_images(src, single, format=fmt, run_options=RunOptions(workers=2, max_failures=3))
    parts = [out_path(tmp_path, fmt, f"p{i}") for i in range(2)]
    for i, part in enumerate(parts):
        pack_images(src, part, format=fmt, input_options=InputOptions(num_shards=2, shard_index=i),
                    run_options=RunOptions(workers=2, max_failures=3))
    merged = out_path(tmp_path, fmt, "merged")
    merge_parts(parts, merged)
    assert _files(merged) == _files(single)


def _files(out: Path) -> dict[str, bytes]:
    """Every file of an output but its manifest (created_by differs) and LMDB's lock file."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())
            if p.name not in ("packer.json", "lock.mdb")}


@pytest.mark.skipif("hdf5" not in FORMATS, reason="needs the hdf5 format")
def test_merge_raw_pixel_hdf5(src, tmp_path):
    from packer.codecs.resize import ResizeSpec

    spec = ResizeSpec.from_options(size="32x24")
    single = tmp_path / "single.h5"
    pack_images(src, single, format="hdf5", resize=spec, raw=True, run_options=RunOptions(workers=0, max_failures=3))
    parts = [tmp_path / f"p{i}.h5" for i in range(3)]
    for i, part in enumerate(parts):
        pack_images(src, part, format="hdf5", resize=spec, raw=True,
                    input_options=InputOptions(num_shards=3, shard_index=i),
                    run_options=RunOptions(workers=0, max_failures=3))
    merge_parts(parts, tmp_path / "merged.h5")
    assert packed_snapshot(tmp_path / "merged.h5") == packed_snapshot(single)
    assert open_reader(tmp_path / "merged.h5").read(0).fmt == "raw"


@dataclass(frozen=True)
class FakeVideoJob:
    """Turns each image into a 'video' of 1-3 frames (the image bytes), with a manifest entry:
    the shape of decode-frames' work without decoding, to test video manifests."""

    def __call__(self, item) -> WorkResult:
        s = ImageJob()(item)
        n = 1 + sum(map(ord, item.key)) % 3
        stem = item.key.rsplit(".", 1)[0]
        frames = [Sample(f"{item.key}/{j + 1}", s.data, s.fmt, s.label, s.height, s.width, s.channels,
                         extra={"frame_dir": stem, "frame": j, "frames": n}) for j in range(n)]
        return WorkResult(frames, entry={"key": item.key, "label": item.label, "fps": 25.0,
                                         "frame_dir": stem, "height": s.height, "width": s.width})


def pack_fake_videos(src: Path, out: Path, fmt: str, num_shards: int = 1, shard_index: int = 0) -> None:
    items, classes = list_image_folder(src)
    items = partition(items, num_shards, shard_index)
    writer = ALL_FORMATS[fmt][0](out, classes=classes, kind="videos", created_by=created_by(
        {"job": "fake-video", "num_shards": num_shards, "shard_index": shard_index}))
    run(items, FakeVideoJob(), writer)


@pytest.mark.parametrize("fmt", sorted(ALL_FORMATS))
def test_merge_offsets_video_entries(src, tmp_path, fmt):
    single = out_path(tmp_path, fmt, "single")
    pack_fake_videos(src, single, fmt)
    parts = [out_path(tmp_path, fmt, f"p{i}") for i in range(3)]
    for i, part in enumerate(parts):
        pack_fake_videos(src, part, fmt, 3, i)
    merged = out_path(tmp_path, fmt, "merged")
    report = merge_parts(parts, merged)
    want = packed_snapshot(single)
    assert report.videos == len(want["videos"]) == 22
    assert packed_snapshot(merged) == want
    starts = [v["start"] for v in want["videos"]]
    assert starts == sorted(starts) and starts[0] == 0


def test_cli_merge_and_help(src, tmp_path):
    runner = CliRunner()
    parts = [str(tmp_path / f"part-{i}") for i in range(2)]
    for i, part in enumerate(parts):
        r = runner.invoke(main, ["to-lmdb", str(src), part, "--workers", "0", "--max-failures", "3",
                                 "--num-shards", "2", "--shard-index", str(i)])
        assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["merge", parts[1], parts[0], str(tmp_path / "merged")])
    assert r.exit_code == 0, r.output
    assert "merged 2 parts, 22 samples" in r.output
    r = runner.invoke(main, ["merge", parts[0], parts[1], str(tmp_path / "merged")])
    assert r.exit_code == 1 and "already exists (use --overwrite" in r.output
    r = runner.invoke(main, ["merge", parts[0], parts[1], str(tmp_path / "merged"), "--overwrite"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["merge", parts[0]])
    assert r.exit_code == 2 and "PART... OUT" in r.output
    assert "--any-parts" in runner.invoke(main, ["merge", "--help"]).output


@pytest.fixture(scope="module")
def lmdb_parts(src, tmp_path_factory) -> list[Path]:
    base = tmp_path_factory.mktemp("parts")
    parts = [base / f"part-{i}" for i in range(3)]
    for i, part in enumerate(parts):
        pack_images(src, part, input_options=InputOptions(num_shards=3, shard_index=i),
                    run_options=RunOptions(workers=0, max_failures=3))
    return parts


def _refused(parts, out, match, **kw):
    with pytest.raises(UsageError, match=match):
        merge_parts(parts, out, **kw)
    assert not Path(out).exists() and not partial_path(Path(out)).exists()


def test_refuses_missing_part(lmdb_parts, tmp_path):
    _refused([lmdb_parts[0], lmdb_parts[2]], tmp_path / "m", r"part 1 of 3 is missing")


def test_refuses_duplicate_part(lmdb_parts, tmp_path):
    _refused([*lmdb_parts, lmdb_parts[1]], tmp_path / "m", r"given twice")
    copy = tmp_path / "copy-of-1"
    shutil.copytree(lmdb_parts[1], copy)
    _refused([*lmdb_parts, copy], tmp_path / "m", r"are both part 1 of 3")


def test_refuses_mismatched_classes(lmdb_parts, tmp_path):
    other = write_image_folder(tmp_path / "other", count=6, classes=2)
    odd = tmp_path / "odd"
    pack_images(other, odd, input_options=InputOptions(num_shards=3, shard_index=1),
                run_options=RunOptions(workers=0))
    _refused([lmdb_parts[0], odd, lmdb_parts[2]], tmp_path / "m", r"classes differ")


def test_refuses_mismatched_kind(src, lmdb_parts, tmp_path):
    video_part = tmp_path / "video-part"
    pack_fake_videos(src, video_part, "lmdb", 3, 1)
    _refused([lmdb_parts[0], video_part, lmdb_parts[2]], tmp_path / "m", r"kind 'videos' differs")


@pytest.mark.skipif(len(FORMATS) < 2, reason="needs two registered formats")
def test_refuses_mismatched_format(src, lmdb_parts, tmp_path):
    fmt = next(f for f in IMAGE_FORMATS if f != "lmdb")
    part = out_path(tmp_path, fmt, "part-1")
    pack_images(src, part, format=fmt, input_options=InputOptions(num_shards=3, shard_index=1),
                run_options=RunOptions(workers=0, max_failures=3))
    _refused([lmdb_parts[0], part, lmdb_parts[2]], tmp_path / "m", r"format .* differs")


def test_refuses_other_options_unless_any_parts(src, lmdb_parts, tmp_path):
    part = tmp_path / "header-checked"
    pack_images(src, part, check="header", input_options=InputOptions(num_shards=3, shard_index=1),
                run_options=RunOptions(workers=0, max_failures=3))
    _refused([lmdb_parts[0], part, lmdb_parts[2]], tmp_path / "m", r"other options .*\(check differ\)")
    merged = tmp_path / "m"
    merge_parts([lmdb_parts[0], part, lmdb_parts[2]], merged, any_parts=True)
    assert open_reader(merged).keys == [k for p in lmdb_parts for k in open_reader(p).keys]


def test_any_parts_merges_in_given_order(lmdb_parts, tmp_path):
    merged = tmp_path / "m"
    merge_parts([lmdb_parts[2], lmdb_parts[0]], merged, any_parts=True)
    assert open_reader(merged).keys == open_reader(lmdb_parts[2]).keys + open_reader(lmdb_parts[0]).keys
    with pytest.raises(UsageError, match="key .* is also in"):
        merge_parts([lmdb_parts[0], merged], tmp_path / "m2", any_parts=True)


def test_refuses_unfinished_and_self_and_unnumbered(lmdb_parts, src, tmp_path):
    unfinished = tmp_path / "part-1"
    partial_path(unfinished).mkdir()
    _refused([lmdb_parts[0], unfinished, lmdb_parts[2]], tmp_path / "m", r"did not finish .* --resume")
    _refused([lmdb_parts[0], partial_path(unfinished)], tmp_path / "m", r"unfinished part")
    _refused([lmdb_parts[0], tmp_path / "nowhere"], tmp_path / "m", r"part does not exist")
    with pytest.raises(UsageError, match="is one of the parts"):
        merge_parts(lmdb_parts, lmdb_parts[0], overwrite=True)
    plain = tmp_path / "plain"
    items, classes = list_image_folder(src)
    run(items[:3], ImageJob(), FORMATS["lmdb"][0](plain, classes=classes))  # no part recorded
    _refused([plain], tmp_path / "m", r"does not say which part it is")


@pytest.mark.slow
def test_killed_part_rerun_with_resume_then_merge(src, tmp_path):
    """A part SIGKILLed halfway is rerun alone with --resume; the merge equals a single run."""
    big = write_image_folder(tmp_path / "big", count=90, classes=3, size=(120, 160))
    single = tmp_path / "single"
    pack_images(big, single, run_options=RunOptions(workers=0))
    parts = [tmp_path / f"part-{i}" for i in range(3)]
    for i in (0, 2):
        pack_images(big, parts[i], input_options=InputOptions(num_shards=3, shard_index=i),
                    run_options=RunOptions(workers=0))
    cmd = packer_cmd("to-lmdb", big, parts[1], "--workers", 2, "--commit-every", 3,
                     "--num-shards", 3, "--shard-index", 1)
    assert run_and_kill(cmd, checkpoint_at_least(partial_path(parts[1]) / ".resume.json", 9))
    with pytest.raises(UsageError, match="did not finish"):
        merge_parts(parts, tmp_path / "merged")
    done = subprocess.run(cmd + ["--resume"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    merge_parts(parts, tmp_path / "merged")
    assert packed_snapshot(tmp_path / "merged") == packed_snapshot(single)


# -- field packs (docs/fields.md): one schema and one COCO category map merge, others are refused --
FIELD_SCHEMA = {"image": "image", "n": "int", "caption": "str", "boxes": "ndarray:float32:*,4"}


def _manifest_pack(root: Path, out: Path, fmt: str, rows: range, schema: dict | None = None) -> Path:
    """A field pack of a JSONL manifest: one image per row (distinct keys per row index)."""
    import json

    from PIL import Image

    import packer

    (root / "pics").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in rows:
        Image.new("RGB", (6 + i, 5), (i * 20 % 256, 0, 0)).save(root / "pics" / f"p{i}.png")
        lines.append(json.dumps({"image": f"pics/p{i}.png", "n": i, "caption": f"row {i}",
                                 "boxes": [[i, 0, i + 1, 2]] * (i % 3)}))
    manifest = root / f"rows-{rows.start}-{rows.stop}.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    packer.pack(root, out, format=fmt, manifest=manifest, schema=schema or FIELD_SCHEMA, workers=0)
    return out


def _dicts(path: Path) -> list[dict]:
    import numpy as np

    from packer import PackedDataset

    ds = PackedDataset(path, decode="bytes")
    return [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in ds[i].items()} for i in range(len(ds))]


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
def test_field_packs_of_one_schema_merge(tmp_path, fmt):
    import packer

    a = _manifest_pack(tmp_path / "src", out_path(tmp_path, fmt, "a"), fmt, range(0, 5))
    b = _manifest_pack(tmp_path / "src", out_path(tmp_path, fmt, "b"), fmt, range(5, 9))
    merged = out_path(tmp_path, fmt, "merged")
    r = CliRunner().invoke(main, ["merge", "--any-parts", str(a), str(b), str(merged)])
    assert r.exit_code == 0, r.output
    assert _dicts(merged) == _dicts(a) + _dicts(b)
    assert open_reader(merged).manifest.schema == open_reader(a).manifest.schema
    assert packer.verify(merged).checked == 9
    again = out_path(tmp_path, fmt, "again")  # the library call does the same
    packer.merge([a, b], again, any_parts=True)
    assert packed_snapshot(again) == packed_snapshot(merged)


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
def test_field_packs_of_other_schemas_or_image_packs_are_refused(src, tmp_path, fmt):
    a = _manifest_pack(tmp_path / "src", out_path(tmp_path, fmt, "a"), fmt, range(0, 4))
    b = _manifest_pack(tmp_path / "src", out_path(tmp_path, fmt, "b"), fmt, range(4, 8),
                       schema={**FIELD_SCHEMA, "n": "float"})
    _refused([a, b], tmp_path / "m", r"its fields \(.*n:float.*\) differ from .*n:int.*only field packs of one "
                                     r"schema merge", any_parts=True)
    images = out_path(tmp_path, fmt, "images")
    pack_images(src, images, format=fmt, run_options=RunOptions(workers=0, max_failures=3))
    _refused([a, images], tmp_path / "m", r"its fields \(no fields \(an image pack\)\) differ", any_parts=True)


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
def test_coco_packs_of_other_category_maps_are_refused(tmp_path, fmt):
    import json

    import packer

    pytest.importorskip("pycocotools")
    from tests.support.coco import make_coco

    made = make_coco(tmp_path, n_images=4)
    data = json.loads(made["instances"].read_text())
    part = out_path(tmp_path, fmt, "part")
    packer.pack(tmp_path, part, format=fmt, coco=made["instances"], workers=0)
    moved = dict(data, categories=[dict(c, id=8) if c["id"] == 7 else c for c in data["categories"]],
                 annotations=[dict(a, category_id=8) if a["category_id"] == 7 else a for a in data["annotations"]])
    (tmp_path / "moved.json").write_text(json.dumps(moved))
    other = out_path(tmp_path, fmt, "other")  # the same names, label 2 now category id 8
    packer.pack(tmp_path, other, format=fmt, coco=tmp_path / "moved.json", workers=0)
    assert open_reader(other).classes == open_reader(part).classes
    _refused([part, other], tmp_path / "m", r"COCO category map differs .*\(label 2: id 8 'cat7' here, "
                                            r"id 7 'cat7' there\)", any_parts=True)
    _refused([part, other], tmp_path / "m", r"COCO category map differs")  # as parts of one run too
