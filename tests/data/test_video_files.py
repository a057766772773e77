"""``pack-videos --to files``: plain re-encoded MP4 files, an mmaction2 video list, and packer's
own readers over them (mmaction2's reading is checked by ``scripts/check/mmaction2.py``).

Frame ``i`` a ``PackedVideoDataset`` clip returns from a plain file must be frame ``i`` of a
sequential decode of that file, as for a packed video.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")

from packer.api import pack_videos, verify  # noqa: E402
from packer.codecs.video_pack import decode_all, index_mp4, pack_stream  # noqa: E402
from packer.data.video import ClipSampling, PackedVideoDataset  # noqa: E402
from packer.errors import CorruptData, VerifyFailed  # noqa: E402
from packer.formats import open_reader  # noqa: E402
from packer.formats.sidecars import partial_path  # noqa: E402

VIDEOS = Path(__file__).resolve().parents[1] / "fixtures" / "videos"


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """Two classes (one with a space in its name), three real clips, one undecodable (AV1)."""
    root = tmp_path_factory.mktemp("vf") / "src"
    for cls, name in (("walk fast", "mmaction2_part_0.mp4"), ("walk fast", "mmaction2_test.avi"),
                      ("swim", "decord_video_90.mov"), ("swim", "torchcodec_av1_video.mkv")):
        (root / cls).mkdir(parents=True, exist_ok=True)
        shutil.copy(VIDEOS / name, root / cls / name)
    return root


@pytest.fixture(scope="module")
def files_out(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("vfout") / "videos"
    report = pack_videos(src, out, to="files", short_side=128, max_frames=48, gop=8, workers=0, max_failures=1)
    return out, report


def sequential(path: Path) -> list[np.ndarray]:
    """Every frame of a plain MP4, decoded in order by one decoder (the reference)."""
    mp4 = path.read_bytes()
    return decode_all(pack_stream(mp4, index_mp4(mp4)))


def test_the_tree_mirrors_the_inputs_and_the_list_is_mmaction2s(files_out):
    out, report = files_out
    assert report.videos == 3 and [Path(f["source"]).name for f in report.failures] == ["torchcodec_av1_video.mkv"]
    manifest = json.loads((out / "packer.json").read_text())
    assert manifest["format"] == "files" and manifest["extra"]["list_file"] == "videos.txt"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.mp4"))
    assert files == ["swim/decord_video_90.mp4", "walk_fast/mmaction2_part_0.mp4", "walk_fast/mmaction2_test.mp4"]
    assert not [p for p in out.rglob(".*") if p.is_file() and p.suffix == ".tmp"]
    classes = manifest["classes"]
    lines = (out / "videos.txt").read_text().splitlines()
    assert sorted(lines) == sorted(f"{v['file']} {v['label']}" for v in manifest["videos"])
    for line in lines:  # mmaction2's VideoDataset: split on whitespace, join to data_prefix
        name, label = line.split(" ")
        assert (out / name).is_file() and classes[int(label)] == Path(name).parent.name.replace("_", " ")


def test_files_are_plain_mp4_with_the_packs_encode(files_out):
    out, _ = files_out
    reader = open_reader(out)
    for i, v in enumerate(reader.manifest.videos):
        path = out / v["file"]
        with av.open(str(path)) as c:  # a plain MP4 any player or loader opens
            s = c.streams.video[0]
            assert (s.codec_context.name, s.frames, min(s.height, s.width)) == ("h264", v["video_frames"], 128)
        index = index_mp4(path.read_bytes())
        assert index.frames == v["video_frames"] and index.keyframes.tolist() == list(range(0, index.frames, 8))
        assert reader.read(i).data == path.read_bytes()
    assert verify(out).ok


@pytest.mark.parametrize("sampling", [ClipSampling(clip_len=8, frame_interval=2, num_clips=2),
                                      ClipSampling(clip_len=1, num_clips=8, test_mode=True),
                                      ClipSampling(clip_len=16, frame_interval=4, test_mode=True)])
def test_packed_video_dataset_reads_the_files_frame_exact(files_out, sampling):
    out, _ = files_out
    ds = PackedVideoDataset(out, sampling=sampling, seed=5)
    refs = [sequential(out / v["file"]) for v in ds.reader.manifest.videos]
    assert [len(r) for r in refs] == [ds._video(i)[0] for i in range(len(ds))]
    for epoch in range(2):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            inds = ds.clip_indices(i)
            clip, label = ds[i]
            assert label == ds.reader.manifest.videos[i]["label"]
            for k, j in enumerate(inds.tolist()):
                assert np.array_equal(clip[k].permute(1, 2, 0).numpy(), refs[i][j]), (i, k, j)


def test_a_damaged_file_is_caught(files_out, tmp_path):
    out, _ = files_out
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    v = open_reader(copy).manifest.videos[0]
    data = bytearray((copy / v["file"]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / v["file"]).write_bytes(bytes(data))
    with pytest.raises(VerifyFailed) as e:
        verify(copy)
    assert any("CRC32C" in p for p in e.value.result.problems)
    with pytest.raises(CorruptData, match="CRC32C"):
        PackedVideoDataset(copy, clip_len=2)[0]


def test_resume_keeps_finished_files_and_drops_a_killed_runs_leftovers(src, tmp_path):
    out = tmp_path / "again"
    first = pack_videos(src, out, to="files", short_side=64, max_frames=16, workers=0, max_failures=1)
    assert first.videos == 3
    again = pack_videos(src, out, to="files", short_side=64, max_frames=16, workers=0, max_failures=1, resume=True)
    assert again.status == "complete"
    # a partial output with one durable file and one written after the last commit
    part = partial_path(tmp_path / "killed")
    shutil.copytree(out, part)
    (part / "packer.json").unlink()
    (part / ".files.journal").write_text(json.dumps(["swim/decord_video_90.mp4", 0]) + "\n")
    from packer.formats.videofiles.writer import VideoFilesWriter

    w = VideoFilesWriter(tmp_path / "killed", classes=["swim", "walk fast"])
    assert w.workdir == part
    w._open(1)
    left = sorted(p.relative_to(part).as_posix() for p in part.rglob("*.mp4"))
    assert left == ["swim/decord_video_90.mp4"]


def test_a_bad_to_is_a_usage_error(src, tmp_path):
    from packer.errors import UsageError

    with pytest.raises(UsageError, match="files"):
        pack_videos(src, tmp_path / "x", to="frames", workers=0)


def test_keyframes_found_no_seek_points_at_pack_time_stay_none(files_out):
    """A plain file's index is rebuilt from its packets' flags: the keyframes the pack-time check
    demoted (HEVC/AV1 re-encodes) come from the manifest entry and must not be sought to."""
    out, _ = files_out
    ds = PackedVideoDataset(out, clip_len=4, frame_interval=1, test_mode=True)
    i = max(range(len(ds)), key=lambda k: ds._video(k)[0])
    ds.reader.manifest.videos[i]["demoted_keyframes"] = [8, 16]  # as the job records them
    mp4 = ds.reader.read(i).data
    index = ds._plain_index(i, mp4)
    assert 8 not in index.keyframes.tolist() and 16 not in index.keyframes.tolist() and 24 in index.keyframes.tolist()
    ref = sequential(out / ds.reader.manifest.videos[i]["file"])
    for want in ([9, 10], [17], [15, 23, 30]):
        got = ds._load(i, np.asarray(want))
        assert all(np.array_equal(g, ref[w]) for g, w in zip(got, want))
