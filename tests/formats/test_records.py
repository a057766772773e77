"""records format: shards, DALI indexes, manifest, resume, integrity (packer/formats/records.py)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from packer.cli import main
from packer.conversion.runner import run
from packer.data.datasets import PackedDataset
from packer.errors import CorruptData, FormatError, UsageError
from packer.formats import open_reader
from packer.formats.sample import Sample
from packer.fileio import parse_bytes
from packer.formats.records import (RecordsReader, RecordsWriter, frame_record, index_path,
                                    read_index, scan_tfrecord, unframe_record)
from packer.codecs.image import decode
from packer.commands.inspection import verify_dataset
from packer.commands.pack_images import ImageJob
from packer.conversion.inputs import image_folder as walk_folder
from packer.synth import jpeg_bytes, natural_image
from packer.conversion.options import RunOptions
from tests.support import FIXTURE_IMAGES, REPO
from tests.support.inputs import write_image_folder
from scripts.timing import scaled


def cli(*args: str, ok: bool = True):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def data_files(out: Path) -> dict[str, bytes]:
    """Everything "byte-identical" covers: shards and indexes (plus keys and failures)."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "packer.json"}


@pytest.fixture(scope="module")
def packed(image_folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rec") / "out"
    cli("to-records", image_folder, out, "--samples-per-shard", 5, "--workers", 0)
    return out


def test_round_trip(image_folder, packed):
    items, classes = walk_folder(image_folder)
    reader = open_reader(packed)
    assert isinstance(reader, RecordsReader) and len(reader) == len(items) == 24
    assert reader.classes == classes
    assert sorted(os.listdir(packed)) == sorted(
        ["packer.json", "keys.json", "sources.bin", "failures.jsonl"]
        + [f"train-{i:05d}.tfrecord{s}" for i in range(5) for s in ("", ".idx")])
    m = json.loads((packed / "packer.json").read_text())
    assert m["format"] == "records" and m["count"] == 24
    assert [s["count"] for s in m["shards"]] == [5, 5, 5, 5, 4]
    for s in m["shards"]:
        shard = packed / s["file"]
        assert s["index"] == s["file"] + ".idx"
        assert s["bytes"] == shard.stat().st_size
        assert s["sha256"] == hashlib.sha256(shard.read_bytes()).hexdigest()
        offsets, sizes = read_index(packed / s["index"])
        assert (offsets.tolist(), sizes.tolist()) == scan_tfrecord(shard)
    for i, it in enumerate(items):
        rec = reader.read(i)
        raw = Path(it.path).read_bytes()
        with Image.open(io.BytesIO(raw)) as im:
            assert (rec.width, rec.height, rec.channels) == (im.width, im.height, 3)
        assert (rec.data, rec.label, rec.fmt, reader.keys[i]) == (raw, it.label, "jpeg", it.key)
    image, label = PackedDataset(packed, decode="numpy")[7]
    assert label == items[7].label
    np.testing.assert_array_equal(image, decode(Path(items[7].path).read_bytes()))
    assert reader.read(-1).data == Path(items[-1].path).read_bytes()
    with pytest.raises(IndexError):
        reader.read(24)


def test_shard_size_rolls_over_before_a_record_that_would_not_fit(image_folder, tmp_path):
    out = tmp_path / "out"
    cli("to-records", image_folder, out, "--shard-size", "4KB", "--workers", 0, "--name", "val")
    reader = open_reader(out)
    shards = reader.manifest.shards
    assert len(shards) > 3 and all(s["file"].startswith("val-") for s in shards)
    assert sum(s["count"] for s in shards) == 24
    for k, s in enumerate(shards):
        assert s["bytes"] <= 4000 or s["count"] == 1
        if k + 1 < len(shards):  # the next shard's first record did not fit
            first_next = int(read_index(out / shards[k + 1]["index"])[1][0])
            assert s["bytes"] + first_next > 4000


def test_output_is_byte_identical_whatever_the_workers(image_folder, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    cli("to-records", image_folder, a, "--samples-per-shard", 7, "--workers", 0)
    cli("to-records", image_folder, b, "--samples-per-shard", 7, "--workers", 2)
    assert data_files(a) == data_files(b)
    ma, mb = (json.loads((p / "packer.json").read_text()) for p in (a, b))
    ma.pop("created_by"), mb.pop("created_by")
    assert ma == mb


@pytest.mark.parametrize("text,size", [("256MB", 256 * 10**6), ("1GiB", 1 << 30), ("1000", 1000),
                                        ("1.5KB", 1500), ("64 mib", 64 << 20), (12, 12)])
def test_parse_bytes(text, size):
    assert parse_bytes(text) == size


@pytest.mark.parametrize("args,message", [
    (["--shard-size", "lots"], "bad size"),
    (["--shard-size", "0"], "positive"),
    (["--samples-per-shard", "0"], "samples_per_shard must be >= 1"),
    (["--name", "../up"], "--name"),
])
def test_bad_arguments_fail_before_any_work(image_folder, tmp_path, args, message):
    out = tmp_path / "out"
    result = cli("to-records", image_folder, out, *args, ok=False)
    assert result.exit_code != 0 and message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "out.partial").exists()


def test_bad_inputs_are_skipped_and_recorded(mixed_folder, tmp_path):
    out = tmp_path / "out"
    result = cli("to-records", mixed_folder, out, "--workers", 0, "--max-failures", 5)
    lines = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    assert sorted(f["key"] for f in lines) == ["class_1/text.jpg", "class_1/truncated.jpg", "class_1/zero.jpg"]
    reader = open_reader(out)
    assert len(reader) == 7 and reader.manifest.failures == 3
    assert "3 failed" in result.output
    assert cli("to-records", mixed_folder, tmp_path / "strict", "--workers", 0, ok=False).exit_code == 1


def test_resume_on_a_finished_output_does_nothing(packed, image_folder):
    before = data_files(packed)
    result = cli("to-records", image_folder, packed, "--samples-per-shard", 5, "--resume")
    assert "complete and verified" in result.output and data_files(packed) == before


def _samples(n: int) -> list[Sample]:
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        data = jpeg_bytes(natural_image(rng, 24, 32))
        out.append(Sample(f"c/{i}.jpg", data, "jpeg", i % 3, 24, 32, 3))
    return out


def _writer(out: Path) -> RecordsWriter:
    return RecordsWriter(out, classes=["a", "b", "c"], samples_per_shard=4)


def _write(out: Path, samples: list[Sample], *, resume_at: int | None = None, finish: bool) -> RecordsWriter:
    """Write ``samples`` (from ``resume_at`` on, when resuming); finish, or stop as a kill would."""
    w = _writer(out)
    w.open(resume_samples=resume_at)
    for s in samples[resume_at or 0:]:
        w.add(s)
    w.close() if finish else w.abort()
    return w


@pytest.mark.parametrize("resume_at", [0, 4, 6, 8])
def test_writer_resume_keeps_complete_shards_and_cuts_inside_one(tmp_path, resume_at):
    samples = _samples(11)
    _write(tmp_path / "ref", samples, finish=True)
    w = _writer(tmp_path / "out")
    w.open()
    durable = []
    w.on_durable = durable.append
    for s in samples[:10]:
        w.add(s)
    w.abort()  # as a kill would leave it: shards 0, 1 complete, shard 2 half written
    assert durable == [4, 8]
    partial = tmp_path / "out.partial"
    assert (partial / "train-00001.tfrecord").is_file() and (partial / ".train-00002.tfrecord.partial").is_file()
    st = (partial / "train-00000.tfrecord").stat()
    first = (st.st_ino, st.st_mtime_ns)
    w = _write(tmp_path / "out", samples, resume_at=resume_at, finish=True)
    assert w.count == 11
    assert data_files(tmp_path / "out") == data_files(tmp_path / "ref")
    st = (tmp_path / "out" / "train-00000.tfrecord").stat()
    kept = (st.st_ino, st.st_mtime_ns) == first
    assert kept == (resume_at >= 4)  # a complete shard inside the checkpoint is kept, not rewritten


def test_writer_resume_twice_inside_a_reopened_shard(tmp_path):
    """A resume cut shard 1 back and reopened it; killed again before it completed (a torn
    record at its end), the next resume at the same point still ends equal to one run."""
    samples = _samples(10)
    _write(tmp_path / "ref", samples, finish=True)
    out = tmp_path / "out"
    _write(out, samples[:9], finish=False)
    _write(out, samples[:7], resume_at=6, finish=False)
    tmp = tmp_path / "out.partial" / ".train-00001.tfrecord.partial"
    assert tmp.is_file() and not (tmp_path / "out.partial" / "train-00001.tfrecord").exists()
    with open(tmp, "ab") as f:
        f.write(frame_record(b"torn record")[:9])
    _write(out, samples, resume_at=6, finish=True)
    assert data_files(out) == data_files(tmp_path / "ref")


@dataclass(frozen=True)
class _InterruptAt:
    """The image work, interrupted (Ctrl-C) when it reaches ``key``."""

    key: str

    def __call__(self, item):
        if item.key == self.key:
            raise KeyboardInterrupt
        return ImageJob()(item)


def test_resume_after_a_retried_failure_and_a_second_interrupt(tmp_path):
    """The checkpoint follows a cut-back at once, so an interrupt right after it loses nothing."""
    src = write_image_folder(tmp_path / "src", count=12, classes=2, size=(20, 24))
    items, classes = walk_folder(src)
    good = Path(items[3].path).read_bytes()
    Path(items[3].path).write_bytes(b"")  # bad on the first run
    out = tmp_path / "out"

    def go(job):
        writer = RecordsWriter(out, classes=classes, samples_per_shard=4)
        return run(items, job, writer, options=RunOptions(resume=True, max_failures=5))

    with pytest.raises(KeyboardInterrupt):
        go(_InterruptAt(items[10].key))  # shards 0, 1 complete; item 3 recorded as failed
    Path(items[3].path).write_bytes(good)  # fixed: the resume retries it and cuts back to it
    with pytest.raises(KeyboardInterrupt):
        go(_InterruptAt(items[4].key))  # ...and is interrupted again before any shard completes
    Path(items[3].path).write_bytes(good[:40])  # a flaky input: bad again on the last run
    report = go(ImageJob())
    assert report.count == 11 and [f["key"] for f in report.failures] == [items[3].key]
    ref = tmp_path / "ref"
    run(items, ImageJob(), RecordsWriter(ref, classes=classes, samples_per_shard=4))
    assert data_files(out) == data_files(ref)


def test_resume_refuses_other_shard_options(tmp_path):
    samples = _samples(5)
    w = RecordsWriter(tmp_path / "out", classes=["a", "b", "c"], samples_per_shard=2)
    w.open()
    for s in samples:
        w.add(s)
    w.abort()
    other = RecordsWriter(tmp_path / "out", classes=["a", "b", "c"], samples_per_shard=3)
    with pytest.raises(UsageError, match="same --shard-size"):
        other.open(resume_samples=4)


def test_video_frame_features_round_trip(tmp_path):
    samples = _samples(3)
    for j, s in enumerate(samples):
        s.extra = {"video_index": 7, "frame": j}  # what decode-frames and merge hand the writer
    with RecordsWriter(tmp_path / "v", classes=["a", "b", "c"], kind="videos") as w:
        for s in samples:
            w.add(s)
        w.close()
    reader = open_reader(tmp_path / "v")
    assert reader.read_features(2)["video/index"] == [7] and reader.read_features(2)["frame/index"] == [2]
    again = reader.sample(1)
    assert again.extra == {"video_index": 7, "frame_index": 1} and again.data == samples[1].data
    assert again.key == samples[1].key and again.label == samples[1].label


def test_empty_output(tmp_path):
    with RecordsWriter(tmp_path / "empty", classes=[]) as w:
        w.close()
    reader = open_reader(tmp_path / "empty")
    assert len(reader) == 0 and reader.manifest.shards == [] and list(reader.verify()) == []
    assert verify_dataset(tmp_path / "empty").ok


def _slow_image_folder(root: Path, count: int) -> Path:
    """Many copies of one large JPEG: a full check decodes each, so a run takes seconds."""
    big = jpeg_bytes(natural_image(np.random.default_rng(0), 1100, 1400), quality=95)
    for i in range(count):
        d = root / f"class_{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        # distinct bytes per file (a comment segment) so shards differ if order goes wrong
        (d / f"img_{i:04d}.jpg").write_bytes(big[:2] + b"\xff\xfe\x00\x06" + i.to_bytes(4, "big") + big[2:])
    return root


@pytest.mark.slow
def test_kill_then_resume_equals_an_uninterrupted_run(tmp_path):
    src = _slow_image_folder(tmp_path / "src", 240)
    ref, out = tmp_path / "ref", tmp_path / "out"
    cli("to-records", src, ref, "--samples-per-shard", 20, "--workers", 2)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-c", "from packer.cli import main; main()", "to-records", str(src), str(out),
           "--samples-per-shard", "20", "--workers", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    partial = tmp_path / "out.partial"
    deadline = time.monotonic() + scaled(120)
    try:
        while len(list(partial.glob("train-*.tfrecord"))) < 3:
            assert proc.poll() is None, "the conversion ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the group we started: the CLI and its pool workers
        proc.wait()
    assert not out.exists() and partial.is_dir()
    complete = sorted(p.name for p in partial.glob("train-*.tfrecord"))
    assert len(complete) < 12  # killed mid-run
    result = cli("to-records", src, out, "--samples-per-shard", 20, "--workers", 2, "--resume")
    assert "240 samples" in result.output
    assert data_files(out) == data_files(ref)
    assert not partial.exists() and not any(p.name.startswith(".") for p in out.iterdir())


# -- integrity -------------------------------------------------------------------------------------
def _copy(packed: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(packed, out)
    return out


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def test_flipped_payload_byte_names_shard_and_record(packed, tmp_path):
    out = _copy(packed, tmp_path)
    shard = out / "train-00001.tfrecord"
    offsets, sizes = read_index(index_path(shard))
    _flip(shard, int(offsets[2] + sizes[2] // 2))
    reader = open_reader(out)
    with pytest.raises(CorruptData) as e:
        reader.read(5 + 2)
    assert "train-00001.tfrecord" in str(e.value) and "record 2" in str(e.value) and "CRC32C" in str(e.value)
    assert e.value.key == reader.keys[7] and e.value.key in str(e.value)
    reader.read(5 + 1), reader.read(5 + 3)  # neighbours are intact
    assert open_reader(out, check_crc=False).read(5 + 2).label >= 0  # only the CRC catches it
    result = cli("verify", out, ok=False)
    assert result.exit_code == 1
    assert "train-00001.tfrecord at record 2" in result.output and "sha256 mismatch" in result.output


def test_flipped_length_byte_is_bad_framing(packed, tmp_path):
    out = _copy(packed, tmp_path)
    shard = out / "train-00003.tfrecord"
    offsets, _ = read_index(index_path(shard))
    _flip(shard, int(offsets[4]) + 1)
    for check in (True, False):
        with pytest.raises(CorruptData, match=r"train-00003\.tfrecord at record 4 .*(length|framing)"):
            open_reader(out, check_crc=check).read(15 + 4)


def test_truncated_shard_names_shard_and_record(packed, tmp_path):
    out = _copy(packed, tmp_path)
    shard = out / "train-00002.tfrecord"
    offsets, sizes = read_index(index_path(shard))
    with open(shard, "r+b") as f:
        f.truncate(int(offsets[3] + 20))
    with pytest.raises(CorruptData, match=r"train-00002\.tfrecord at record 3 .*truncated"):
        open_reader(out).read(10 + 3)
    problems = verify_dataset(out).problems
    assert any("train-00002.tfrecord" in p and "truncated shard" in p for p in problems)
    assert any("train-00002.tfrecord at record 3" in p for p in problems)
    assert not any("at record 2" in p for p in problems)


def test_damaged_index_and_manifest(packed, tmp_path):
    out = _copy(packed, tmp_path)
    idx = out / "train-00000.tfrecord.idx"
    idx.write_text("".join(idx.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(CorruptData, match="train-00000.tfrecord.idx.*4 entries, manifest says 5"):
        open_reader(out).read(0)
    assert any("4 entries" in p for p in verify_dataset(out).problems)
    idx.write_text("0 12\nnot numbers\n")
    with pytest.raises(CorruptData, match="malformed index line 2"):
        open_reader(out).read(0)
    m = json.loads((out / "packer.json").read_text())
    m["format_version"] = 2
    (out / "packer.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match="unknown format_version 2"):
        open_reader(out)


@settings(max_examples=300, deadline=None)
@given(key=st.text(min_size=1, max_size=200), label=st.integers(-(1 << 63), (1 << 63) - 1),
       hw=st.tuples(st.integers(0, 1 << 20), st.integers(0, 1 << 20)), channels=st.sampled_from([0, 1, 3, 4]),
       fmt=st.sampled_from(["jpeg", "png", "webp", "bmp"]),
       size=st.sampled_from([0, 1, 127, 128, 255, 16383, 16384, 51_000, 2_097_151, 2_097_152]),
       extra=st.sampled_from([{}, {"video_index": 3}, {"frame_index": 7}, {"video_index": 0, "frame": 2}]))
def test_the_image_layout_is_the_generic_example_encoding(key, label, hw, channels, fmt, size, extra):
    """``sample_pieces`` (the hot path of to-records) lays an image's Example out directly: it must
    be the generic encoder's bytes for every sample, whatever the lengths (1-4 byte varints)."""
    from packer.codecs.tfexample import encode_example
    from packer.formats.records.example import sample_features, sample_pieces

    sample = Sample(key, bytes([size % 251]) * size, fmt, label, hw[0], hw[1], channels, dict(extra))
    pieces, length = sample_pieces(sample)
    assert b"".join(pieces) == encode_example(sample_features(sample)) and length == sum(map(len, pieces))
    assert any(p is sample.data for p in pieces) or size == 0 or extra  # the image bytes are not copied


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300), st.data())
def test_framing_round_trip_and_every_flip_is_caught(payload, data):
    framed = frame_record(payload)
    assert len(framed) == len(payload) + 16
    assert bytes(unframe_record(framed)) == payload
    pos = data.draw(st.integers(0, len(framed) - 1))
    bad = bytearray(framed)
    bad[pos] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(CorruptData):
        unframe_record(bytes(bad), where="x.tfrecord", position="record 0")


def test_real_fixture_images(tmp_path):
    src = tmp_path / "src" / "fixtures"
    src.mkdir(parents=True)
    for p in FIXTURE_IMAGES.iterdir():
        if p.suffix.lower() in (".jpg", ".jpeg", ".png"):
            shutil.copy(p, src / p.name)
    out = tmp_path / "out"
    cli("to-records", tmp_path / "src", out, "--workers", 0, "--max-failures", 1)
    failures = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    assert [f["key"] for f in failures] == ["fixtures/pillow_truncated_jpeg.jpg"]
    ds = PackedDataset(out, decode="numpy")
    for i, key in enumerate(ds.keys):
        image, _ = ds[i]
        np.testing.assert_array_equal(image, decode((src.parent / key).read_bytes()))
    rotated = ds.keys.index("fixtures/pillow_hopper_orientation_6.jpg")
    rec = ds.reader.read(rotated)
    assert ds[rotated][0].shape[:2] == (rec.width, rec.height)  # EXIF applied on decode
    assert cli("verify", out).exit_code == 0
