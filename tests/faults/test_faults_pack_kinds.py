"""Each dataset class reads its kind of pack and refuses another with a ``UsageError`` naming the
class to use (``Manifest.holds``), never ``CorruptData``: with ``on_corrupt="skip"`` a pack of
the wrong kind would otherwise be skipped sample by sample."""
from __future__ import annotations

from pathlib import Path

import pytest

from packer import FrameDataset, PackedDataset, PackedVideoDataset, StreamingDataset
from packer.commands.decode_frames import decode_frames
from packer.commands.pack_images import pack_images
from packer.commands.pack_videos import pack_videos
from packer.errors import UsageError
from packer.manifest import Manifest
from packer.commands.pack_videos import VideoPackOptions
from tests.support.inputs import write_image_folder, write_video
from packer.conversion.options import RunOptions


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    """An image pack, a video pack (pack-videos), frame folders and a packed frame output."""
    root = tmp_path_factory.mktemp("kinds")
    pack_images(write_image_folder(root / "imgs", count=6, classes=2, size=(8, 8)), root / "images.lmdb",
                format="lmdb", run_options=RunOptions(workers=0))
    for i in range(2):
        write_video(root / "src" / f"c{i}" / f"v{i}.mp4", frames=6, size=(32, 32), seed=i)
    pack_videos(root / "src", root / "videos.records", to="records",
                pack_options=VideoPackOptions(short_side=32, gop=4),
                run_options=RunOptions(workers=0, timeout=600.0))
    decode_frames(root / "src", root / "frames", run_options=RunOptions(workers=0, timeout=600.0))
    decode_frames(root / "src", root / "frames.lmdb", to="lmdb", run_options=RunOptions(workers=0, timeout=600.0))
    return {"images": root / "images.lmdb", "videos": root / "videos.records", "frames": root / "frames",
            "frames.lmdb": root / "frames.lmdb"}


def test_the_manifest_says_what_a_pack_holds(packs):
    assert {k: Manifest.load(p).holds for k, p in packs.items()} == {
        "images": "images", "videos": "videos", "frames": "frames", "frames.lmdb": "frames"}


@pytest.mark.parametrize("open_it, pack, use", [
    (lambda p: PackedDataset(p, decode="bytes"), "videos", "use PackedVideoDataset"),
    (lambda p: StreamingDataset(p, decode="bytes", on_corrupt="skip", max_skipped=1.0), "videos",
     "use PackedVideoDataset"),
    (lambda p: PackedVideoDataset(p, clip_len=2), "images", r"use PackedDataset \(or StreamingDataset\)"),
    (lambda p: FrameDataset(p, clip_len=2), "images", r"use PackedDataset \(or StreamingDataset\)"),
    (lambda p: FrameDataset(p, clip_len=2), "videos", "use PackedVideoDataset"),
    (lambda p: FrameDataset(p, clip_len=2), "frames.lmdb", "packed as lmdb; use PackedVideoDataset"),
], ids=["PackedDataset-videos", "StreamingDataset-skip-videos", "PackedVideoDataset-images",
        "FrameDataset-images", "FrameDataset-videos", "FrameDataset-frames.lmdb"])
def test_the_wrong_kind_of_pack_names_the_class_to_use(packs, open_it, pack, use):
    with pytest.raises(UsageError, match=use):
        open_it(packs[pack])


def test_each_class_reads_its_own_kind(packs):
    assert len(PackedDataset(packs["images"], decode="bytes")) == 6
    assert len(PackedDataset(packs["frames.lmdb"], decode="bytes")) == 12  # frames one by one, as images
    assert len(PackedVideoDataset(packs["videos"], clip_len=2)) == 2
    assert len(PackedVideoDataset(packs["frames.lmdb"], clip_len=2)) == 2
    assert len(FrameDataset(packs["frames"], clip_len=2)) == 2
