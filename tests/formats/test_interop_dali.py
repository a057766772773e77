"""Interop with the real peer NVIDIA DALI: its CPU readers read what packer writes.

``fn.readers.tfrecord`` reads our records shards through our ``.idx`` files and
``fn.readers.caffe`` reads our LMDB (Caffe ``Datum`` values); ``fn.decoders.image`` (CPU)
decodes the bytes. Every sample must come back once, in order, with the bytes, label, key and
pixels packer's own reader gives. DALI ships wheels for x86-64 Linux only: there the ``test``
extra installs it and a missing DALI fails this module; elsewhere the module skips.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.cli import main
from packer.codecs.image import decode
from packer.formats import open_reader
from packer.synth import natural_image
from tests.support.inputs import write_image_folder, write_video_folder

if not (sys.platform == "linux" and platform.machine() == "x86_64"):
    pytest.skip("NVIDIA DALI ships wheels for x86-64 Linux only (the test extra's marker)",
                allow_module_level=True)

# No importorskip: on x86-64 Linux the test extra installs DALI, so its absence is a failure.
import nvidia.dali.fn as fn  # noqa: E402
import nvidia.dali.tfrecord as tfrec  # noqa: E402
from nvidia.dali import pipeline_def  # noqa: E402

READER = "reader"
BATCH = 4


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def run_epoch(pipeline) -> list[list[np.ndarray]]:
    """One epoch of a CPU pipeline, sample by sample: ``[outputs of sample 0, ...]``.

    The reader's ``epoch_size`` is how many records DALI found; batches are cut there (the
    last batch is padded), so the list holds each record DALI reads once, in its order.
    """
    pipe = pipeline()
    pipe.build()
    size = pipe.epoch_size(READER)
    samples: list[list[np.ndarray]] = []
    while len(samples) < size:
        outputs = pipe.run()
        for k in range(len(outputs[0])):
            samples.append([np.array(o.at(k)) for o in outputs])
    return samples[:size]


def records_pipeline(shards: list[str], indexes: list[str], *, frames: bool = False):
    features = {"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1),
                "image/filename": tfrec.FixedLenFeature((), tfrec.string, ""),
                "image/format": tfrec.FixedLenFeature((), tfrec.string, "")}
    if frames:
        features["video/index"] = tfrec.FixedLenFeature([1], tfrec.int64, -1)
        features["frame/index"] = tfrec.FixedLenFeature([1], tfrec.int64, -1)

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        inputs = fn.readers.tfrecord(path=shards, index_path=indexes, features=features,
                                     random_shuffle=False, pad_last_batch=True, name=READER)
        image = fn.decoders.image(inputs["image/encoded"], device="cpu")
        outs = [inputs["image/encoded"], inputs["image/class/label"], image, inputs["image/filename"],
                inputs["image/format"]]
        if frames:
            outs += [inputs["video/index"], inputs["frame/index"]]
        return tuple(outs)

    return pipe


def caffe_pipeline(path: Path):
    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        encoded, label = fn.readers.caffe(path=str(path), random_shuffle=False, pad_last_batch=True,
                                          name=READER)
        return encoded, label, fn.decoders.image(encoded, device="cpu")

    return pipe


def shards_of(out: Path) -> tuple[list[str], list[str]]:
    shards = json.loads((out / "packer.json").read_text())["shards"]
    return [str(out / s["file"]) for s in shards], [str(out / s["index"]) for s in shards]


def assert_same_image(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    """Identical pixels: both sides decode JPEG with libjpeg-turbo and its defaults (packer
    through simplejpeg, OpenCV or Pillow, whichever PACKER_DECODER picks: all three agree here;
    DALI's CPU decoder through nvImageCodec), and PNG is lossless."""
    assert theirs.dtype == np.uint8 and theirs.shape == ours.shape, (what, theirs.shape, ours.shape)
    assert np.array_equal(ours, theirs), (what, int(np.abs(ours.astype(int) - theirs).max()))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """13 JPEGs in 3 classes plus a PNG and a greyscale JPEG: 15 inputs, small."""
    root = write_image_folder(tmp_path_factory.mktemp("dali") / "src", count=13, classes=3)
    rng = np.random.default_rng(7)
    Image.fromarray(natural_image(rng, 37, 53)).save(root / "class_0" / "png_0.png")
    Image.fromarray(natural_image(rng, 41, 29)[:, :, 1]).save(root / "class_2" / "grey_0.jpg", quality=85)
    return root


def check_against_packer(out: Path, got: list[list[np.ndarray]]) -> None:
    """DALI's samples (encoded, label, decoded image, ...) are packer's reader's, one for one:
    count, order, bytes, labels, pixels."""
    reader = open_reader(out)
    assert len(got) == len(reader) == reader.manifest.count
    for i, (encoded, label, image, *_) in enumerate(got):
        ours = reader.sample(i)
        assert encoded.tobytes() == ours.data, f"sample {i} ({reader.keys[i]}): bytes differ"
        assert label.shape == (1,) and int(label[0]) == ours.label, f"sample {i}: label {label} != {ours.label}"
        assert_same_image(decode(ours.data), image, f"sample {i} ({reader.keys[i]})")


# One writer with a fixed layout (15 samples: 4 + 4 + 4 + 3), and shards cut by size with
# worker processes: the "sharded" plan of the parallel write path (issue 18: the workers write
# the shards, the writer adopts them) where that path exists, the pool and one writer before.
LAYOUTS = {"samples-per-shard": ["--samples-per-shard", 4, "--workers", 0],
           "shard-size+workers": ["--shard-size", "6KB", "--workers", 2]}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_dali_tfrecord_reader_reads_our_shards_through_our_idx(images, tmp_path, layout, caplog):
    out = tmp_path / "records"
    caplog.set_level(logging.INFO, logger="packer.commands.pack_images")
    cli("to-records", images, out, *LAYOUTS[layout])
    if layout != "samples-per-shard" and importlib.util.find_spec("packer.conversion.plans.sharded"):
        assert "to-records: sharded" in caplog.text  # the workers wrote these shards
    shards, indexes = shards_of(out)
    assert len(shards) == 4 if layout == "samples-per-shard" else len(shards) >= 3
    got = run_epoch(records_pipeline(shards, indexes))
    check_against_packer(out, got)
    reader = open_reader(out)
    assert [s[3].tobytes().decode() for s in got] == list(reader.keys)
    assert {s[4].tobytes() for s in got} == {b"jpeg", b"png"}
    assert sorted({int(s[1][0]) for s in got}) == [0, 1, 2]
    # DALI's own indexer (the wheel's tfrecord2idx script) writes our .idx byte for byte
    script = Path(sysconfig.get_path("scripts")) / "tfrecord2idx"  # beside this interpreter, not a shim
    assert script.is_file(), f"the DALI wheel's tfrecord2idx script is not at {script}"
    for shard, idx in zip(shards, indexes):
        theirs = tmp_path / "theirs.idx"
        subprocess.run([sys.executable, str(script), shard, str(theirs)], check=True, capture_output=True)
        assert theirs.read_bytes() == Path(idx).read_bytes(), shard


def test_dali_caffe_reader_reads_our_lmdb(images, tmp_path):
    out = tmp_path / "lmdb"
    cli("to-lmdb", images, out, "--workers", 0, "--commit-every", 4)
    got = run_epoch(caffe_pipeline(out))
    check_against_packer(out, got)
    assert got[0][1].dtype == np.int32  # DALI's Caffe labels are int32 (the Datum's field)


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Path:
    """Two classes of two short videos (mp4 + avi): ~22 frames in all."""
    return write_video_folder(tmp_path_factory.mktemp("dali") / "videos", per_class=2, classes=2, frames=5)


def expected_frames(out: Path) -> list[tuple[int, int, int]]:
    """(label, video index, frame index) of each stored frame, from the manifest's videos."""
    rows = []
    for v, video in enumerate(json.loads((out / "packer.json").read_text())["videos"]):
        rows += [(video["label"], v, f) for f in range(video["length"])]
    return rows


def test_dali_reads_decode_frames_records(videos, tmp_path):
    out = tmp_path / "frames.records"
    cli("decode-frames", videos, out, "--to", "records", "--workers", 0)
    got = run_epoch(records_pipeline(*shards_of(out), frames=True))
    check_against_packer(out, got)
    reader = open_reader(out)
    assert [s[3].tobytes().decode() for s in got] == list(reader.keys)
    # DALI 2.4 gives a feature a record lacks as a 0-d tensor of uninitialised memory, not the
    # default_value: the shapes prove both indexes are present in every record
    assert all(s[5].shape == s[6].shape == (1,) for s in got)
    dali = [(int(s[1][0]), int(s[5][0]), int(s[6][0])) for s in got]
    assert dali == [(reader.sample(i).label, reader.sample(i).extra["video_index"],
                     reader.sample(i).extra["frame_index"]) for i in range(len(reader))]
    assert dali == expected_frames(out)
    assert len({v for _, v, _ in dali}) == 4


def test_dali_reads_decode_frames_lmdb(videos, tmp_path):
    out = tmp_path / "frames.lmdb"
    cli("decode-frames", videos, out, "--to", "lmdb", "--workers", 0)
    got = run_epoch(caffe_pipeline(out))
    check_against_packer(out, got)
    assert [int(s[1][0]) for s in got] == [label for label, _, _ in expected_frames(out)]

