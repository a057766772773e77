"""Video fields: a manifest column naming video files, packed as pack-videos packs them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

import packer
from packer.codecs.fields import Schema
from packer.codecs.video_pack import PackedVideo, decode_all
from packer.formats import open_reader
from packer.synth import write_video

FORMATS = ["lmdb", "records", "hdf5"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> tuple[Path, Path]:
    """A root with three small videos (one of them broken) and a JSON Lines manifest over them."""
    root = tmp_path_factory.mktemp("clips")
    rows = []
    for i in range(3):
        write_video(root / "v" / f"clip{i}.mp4", frames=12 + 4 * i, size=(40, 56), seed=i)
        rows.append({"clip": f"v/clip{i}.mp4", "label": i, "caption": f"clip number {i}"})
    (root / "v" / "broken.mp4").write_bytes(b"not a video at all" * 10)
    rows.append({"clip": "v/broken.mp4", "label": 9, "caption": "broken"})
    manifest = root / "clips.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, manifest


def test_a_video_column_is_inferred_and_keys_the_sample(clips, tmp_path):
    root, manifest = clips
    report = packer.pack(root, tmp_path / "out.lmdb", manifest=manifest, workers=0, max_failures=1)
    ds = packer.PackedDataset(tmp_path / "out.lmdb")
    assert [f.spec() for f in ds.schema.fields] == ["video", "int", "str"]
    assert ds.keys == ["v/clip0.mp4", "v/clip1.mp4", "v/clip2.mp4"]
    assert [f["key"] for f in report.failures] == ["v/broken.mp4"]  # the broken video, recorded; the others packed


@pytest.mark.parametrize("fmt", FORMATS)
def test_video_fields_hold_the_stream_pack_videos_makes(clips, tmp_path, fmt):
    root, manifest = clips
    out = tmp_path / f"out.{fmt}"
    packer.pack(root, out, format=fmt, manifest=manifest, workers=0, max_failures=1)
    failures = [json.loads(line) for line in (out / "failures.jsonl" if out.is_dir() else
                                               Path(f"{out}.failures.jsonl")).read_text().splitlines()]
    assert [f["key"] for f in failures] == ["v/broken.mp4"]
    # the same videos through pack-videos, at their own size: the same packed streams
    videos = tmp_path / "videos"
    packer.pack_videos(root / "v", videos, to="lmdb", short_side=None,
                       workers=0, max_failures=1)
    reader = open_reader(videos)
    reference = {reader.keys[i].rsplit("/", 1)[-1]: bytes(reader.read(i).data) for i in range(len(reader))}
    ds = packer.PackedDataset(out)
    for i in range(len(ds)):
        s = ds[i]
        assert isinstance(s["clip"], PackedVideo)
        assert s["label"] == i and s["caption"] == f"clip number {i}"
        assert len(s["clip"]) == 12 + 4 * i
        assert bytes(s["clip"]._blob) == reference[f"clip{i}.mp4"]
        # frames() decodes only what it needs and equals a sequential decode
        whole = np.stack(decode_all(s["clip"]._blob))
        pick = [len(s["clip"]) - 1, 0, 5, 5]
        assert np.array_equal(s["clip"].frames(pick), whole[pick])


def test_video_fields_follow_the_short_side(clips, tmp_path):
    root, manifest = clips
    packer.pack(root, tmp_path / "out.lmdb", manifest=manifest, workers=0, max_failures=1,
                resize=packer.ResizeSpec(short_side=20))
    frame = packer.PackedDataset(tmp_path / "out.lmdb")[0]["clip"].frames([0])
    assert frame.shape == (1, 20, 28, 3)


def test_a_video_field_refuses_bytes_that_are_no_packed_video():
    schema = Schema({"clip": "video"})
    with pytest.raises(ValueError, match="not a packed video"):
        schema.encode({"clip": b"\x00" * 64})


def test_a_video_field_exports_as_its_mp4(clips, tmp_path):
    webdataset = pytest.importorskip("webdataset")
    root, manifest = clips
    packer.pack(root, tmp_path / "out.lmdb", manifest=manifest, workers=0, max_failures=1)
    packer.export(tmp_path / "out.lmdb", tmp_path / "wds", to="wds")
    ds = packer.PackedDataset(tmp_path / "out.lmdb")
    got = list(webdataset.WebDataset(sorted(str(p) for p in (tmp_path / "wds").glob("*.tar")), shardshuffle=False))
    assert len(got) == len(ds)
    for i, sample in enumerate(got):
        (mp4,) = [v for k, v in sample.items() if k.endswith("mp4")]
        assert mp4 == bytes(ds[i]["clip"].mp4)
