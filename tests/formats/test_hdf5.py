"""The HDF5 format: round trips (encoded + raw), resume after SIGKILL, DataLoader workers under
fork and spawn, and damaged files."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader

from packer import PackedDataset
from packer.cli import main
from packer.errors import CorruptData, FormatError, PackerError
from packer.formats import FORMATS, detect_format, open_reader
from packer.formats.sample import Sample
from packer.formats.hdf5 import MANIFEST_ATTR, HDF5Reader, HDF5Writer
from packer.codecs.image import decode
from packer.codecs.resize import ResizeSpec, resize_pixels
from tests.support import REPO
from tests.support.inputs import write_image_folder
from tests.support.killing import checkpoint_at_least, run_and_kill


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def datasets(path: Path) -> dict[str, np.ndarray]:
    """Every dataset of an HDF5 file, as arrays (what "the same output" means for HDF5)."""
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in f}


@pytest.fixture(scope="module")
def packed(tmp_path_factory, image_folder):
    d = tmp_path_factory.mktemp("h5")
    enc, raw = d / "enc.h5", d / "raw.h5"
    assert cli("to-hdf5", str(image_folder), str(enc), "--workers", "0").exit_code == 0
    r = cli("to-hdf5", str(image_folder), str(raw), "--raw", "--size", "40x32", "--workers", "0")
    assert r.exit_code == 0, r.output
    return image_folder, enc, raw


def test_registered():
    assert FORMATS["hdf5"] == (HDF5Writer, HDF5Reader)


def test_encoded_round_trip(packed):
    src, enc, _ = packed
    assert detect_format(enc) == "hdf5"
    ds = PackedDataset(enc, decode="bytes")
    files = sorted(src.rglob("*.jpg"), key=lambda p: (p.parent.name, p.name))
    assert len(ds) == len(files) == 24
    assert ds.classes == ["class_0", "class_1", "class_2"]
    for i, path in enumerate(files):
        data, label = ds[i]
        assert data == path.read_bytes()
        assert ds.keys[i] == f"{path.parent.name}/{path.name}" and label == int(path.parent.name[-1])
    with h5py.File(enc, "r") as f:
        assert set(f) == {"blobs", "offsets", "labels", "keys", "crc32c", "shapes", "sources"}
        assert f["blobs"].dtype == np.uint8 and f["blobs"].ndim == 1
        assert f["offsets"].dtype == np.int64 and f["offsets"].shape == (25,)
        assert f["offsets"][-1] == f["blobs"].shape[0]
        manifest = json.loads(f.attrs[MANIFEST_ATTR])
    assert manifest["format"] == "hdf5" and manifest["count"] == 24 and manifest["format_version"] == 1
    assert (enc.parent / "enc.h5.failures.jsonl").read_text() == ""
    assert not (enc.parent / "enc.h5.partial").exists() and not (enc.parent / "enc.h5.partial.journal").exists()
    rec = ds.reader.read(3)
    h, w = decode(rec.data).shape[:2]
    assert (rec.fmt, rec.height, rec.width, rec.channels) == ("jpeg", h, w, 3)


def test_raw_round_trip_every_decode_mode(packed):
    src, _, raw = packed
    with h5py.File(raw, "r") as f:
        assert "blobs" not in f and f["pixels"].shape == (24, 32, 40, 3)
        assert f["pixels"].chunks == (1, 32, 40, 3) and f["pixels"].dtype == np.uint8
    manifest = open_reader(raw).manifest
    assert manifest.created_by["options"]["raw"] is True
    assert manifest.created_by["options"]["resize"]["size"] == [40, 32]
    files = sorted(src.rglob("*.jpg"), key=lambda p: (p.parent.name, p.name))
    spec = ResizeSpec(size=(40, 32))
    views = {m: PackedDataset(raw, decode=m) for m in ("numpy", "tensor", "pil", "bytes")}
    for i in (0, 7, 23):
        expected = resize_pixels(files[i].read_bytes(), spec)
        arr, label = views["numpy"][i]
        assert arr.flags.writeable and np.array_equal(arr, expected)
        tensor, _ = views["tensor"][i]
        assert tensor.dtype == torch.uint8 and tuple(tensor.shape) == (3, 32, 40)
        assert np.array_equal(tensor.permute(1, 2, 0).numpy(), expected)
        assert np.array_equal(np.asarray(views["pil"][i][0]), expected)
        assert views["bytes"][i][0] == expected.tobytes()
        assert label == int(files[i].parent.name[-1])
    assert cli("verify", str(raw)).exit_code == 0


def test_failures_beside_the_file_and_manifest_counts(mixed_folder, tmp_path):
    out = tmp_path / "mixed.h5"
    r = cli("to-hdf5", str(mixed_folder), str(out), "--workers", "0", "--max-failures", "3")
    assert r.exit_code == 0, r.output
    failures = [json.loads(x) for x in (tmp_path / "mixed.h5.failures.jsonl").read_text().splitlines()]
    assert sorted(f["key"] for f in failures) == ["class_1/text.jpg", "class_1/truncated.jpg", "class_1/zero.jpg"]
    reader = open_reader(out)
    assert reader.manifest.failures == 3 and len(reader) == 7
    r = cli("to-hdf5", str(mixed_folder), str(out), "--workers", "0")
    assert r.exit_code != 0 and "already exists" in r.output
    r = cli("to-hdf5", str(mixed_folder), str(out), "--resume", "--workers", "0")
    assert r.exit_code == 0 and "complete and verified" in r.output


def test_raw_needs_a_size_and_hdf5(image_folder, tmp_path):
    for args, msg in [(("--raw",), "--raw needs --size"), (("--raw", "--short-side", "20"), "--raw needs --size"),
                      (("--raw", "--size", "8x8", "--format", "png"), "--format does not apply")]:
        r = cli("to-hdf5", str(image_folder), str(tmp_path / "x.h5"), *args)
        assert r.exit_code != 0 and msg in r.output, r.output
    from packer.commands.pack_images import pack_images
    with pytest.raises(PackerError, match="for hdf5 output"):
        pack_images(image_folder, tmp_path / "x.lmdb", format="lmdb", raw=True, resize=ResizeSpec(size=(8, 8)))


def test_writer_checks_layout_and_writes_videos(tmp_path):
    with pytest.raises(ValueError):
        HDF5Writer(tmp_path / "x.h5", classes=[], pixels_shape=(0, 4, 3))
    w = HDF5Writer(tmp_path / "v.h5", classes=["a", "b"], kind="videos", commit_every=2)
    w.open()
    with pytest.raises(ValueError, match="pixels_shape"):
        w.add(Sample("x", b"\0" * 12, "raw", 0, 2, 2, 3))
    frames = [Sample(f"v{v}/{i}", bytes([v, i]) * 10, "jpeg", v, 1, 1, 3) for v in (0, 1) for i in range(3 + v)]
    for s in frames:
        w.add(s)
    videos = [{"key": "v0", "label": 0, "start": 0, "length": 3, "fps": 30.0},
              {"key": "v1", "label": 1, "start": 3, "length": 4, "fps": 25.0}]
    w.close(videos=videos)
    got = datasets(tmp_path / "v.h5")
    assert got["video_offsets"].tolist() == [0, 3, 7] and got["video_labels"].tolist() == [0, 1]
    assert [k.decode() for k in got["video_keys"]] == ["v0", "v1"]
    reader = open_reader(tmp_path / "v.h5")
    assert [reader.read(i).data for i in range(7)] == [s.data for s in frames]
    assert reader.manifest.videos == videos and not list(reader.verify_structure())


# -- resume after a real SIGKILL --------------------------------------------------------------------
KILLED_RUN = """
import sys, time
import packer.commands.pack_images as pack
from packer.codecs.resize import ResizeSpec
from packer.conversion.options import RunOptions
call = pack.ImageJob.__call__
done = [0]
def slow(self, item):  # slow the work down so the kill lands mid-run
    done[0] += 1
    while done[0] > 20:  # and past 20 inputs wait for it: the run cannot end before the kill
        time.sleep(3600)
    time.sleep(0.03)
    return call(self, item)
pack.ImageJob.__call__ = slow
raw = sys.argv[3] == "raw"
pack.pack_images(sys.argv[1], sys.argv[2], format="hdf5", run_options=RunOptions(workers=0, max_failures=99),
                 raw=raw, resize=ResizeSpec(size=(24, 20)) if raw else None, writer_options={"commit_every": 3})
"""


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["encoded", "raw"])
def test_resume_after_sigkill_equals_an_uninterrupted_run(tmp_path, layout):
    src = write_image_folder(tmp_path / "src", count=40, classes=2)
    good = (src / "class_0" / "img_0000.jpg").read_bytes()
    (src / "class_1" / "img_0009.jpg").write_bytes(good[: len(good) // 2])  # a failure before the kill
    (src / "class_1" / "img_0031.jpg").write_bytes(b"")  # and one after
    extra = ["--raw", "--size", "24x20"] if layout == "raw" else []
    ref = tmp_path / "ref.h5"
    assert cli("to-hdf5", str(src), str(ref), "--workers", "0", "--max-failures", "9", *extra).exit_code == 0

    out = tmp_path / "out.h5"
    ckpt = tmp_path / "out.h5.partial.journal" / ".resume.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = run_and_kill([sys.executable, "-c", KILLED_RUN, str(src), str(out), layout],
                          checkpoint_at_least(ckpt, 12, "items_done"))
    assert killed, "the run ended before it could be killed"
    assert not out.exists() and (tmp_path / "out.h5.partial").exists()
    done = json.loads(ckpt.read_text())["items_done"]
    assert 12 <= done < 40

    r = cli("to-hdf5", str(src), str(out), "--resume", "--workers", "2", "--max-failures", "9", *extra)
    assert r.exit_code == 0, r.output
    a, b = datasets(ref), datasets(out)
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    assert (tmp_path / "ref.h5.failures.jsonl").read_text() == (tmp_path / "out.h5.failures.jsonl").read_text()
    assert open_reader(out).manifest.count == open_reader(ref).manifest.count == 38
    assert not (tmp_path / "out.h5.partial.journal").exists()


def test_resume_refuses_a_damaged_partial(tmp_path, image_folder):
    """A partial file that no longer matches its CRC journal is refused, not trusted."""
    out = tmp_path / "o.h5"
    w = HDF5Writer(out, classes=["a"], commit_every=2)
    w.open()
    for i in range(4):
        w.add(Sample(f"k{i}", bytes([i]) * 50, "jpeg", 0, 1, 1, 3))
    w.flush()
    w.abort()
    partial = tmp_path / "o.h5.partial"
    with h5py.File(partial, "r+") as f:
        f["blobs"][10] = 99
    w2 = HDF5Writer(out, classes=["a"])
    with pytest.raises(CorruptData, match="does not match its journal"):
        w2.open(resume_samples=4)
    w3 = HDF5Writer(out, classes=["a"])
    w3.open(resume_samples=0)  # cutting back to nothing needs no check
    w3.close()
    assert len(open_reader(out)) == 0


# -- DataLoader workers -----------------------------------------------------------------------------
def _collect(ds, ctx: str) -> list:
    loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context=ctx, collate_fn=list)
    return [item for batch in loader for item in batch]


def test_dataloader_workers(packed):
    """Forked workers (spawned ones: tests/data/test_datasets.py, every format at once)."""
    _, enc, raw = packed
    parts = [PackedDataset(enc, decode="bytes"), PackedDataset(raw, decode="tensor")]
    first = [d[0] for d in parts]  # the parent opens both files before the workers start
    ds = torch.utils.data.ConcatDataset(parts)
    got = _collect(ds, "fork")
    assert len(got) == len(ds) == 48
    direct = [ds[i] for i in range(len(ds))]
    for (x, y), (dx, dy) in zip(got, direct):
        assert y == dy and (torch.equal(x, dx) if isinstance(x, torch.Tensor) else x == dx)
    assert [d[0][1] for d in parts] == [f[1] for f in first]
    assert isinstance(got[0][0], bytes) and tuple(got[30][0].shape) == (3, 32, 40)


# -- damaged files ----------------------------------------------------------------------------------
def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


def _data_offset(path: Path, name: str) -> int:
    with h5py.File(path, "r") as f:
        return f[name].id.get_chunk_info(0).byte_offset


@pytest.mark.parametrize("layout", ["enc", "raw"])
def test_flipped_byte_is_corrupt_data(packed, tmp_path, layout):
    path = _copy(packed[1] if layout == "enc" else packed[2], tmp_path / f"{layout}.h5")
    at = _data_offset(path, "blobs" if layout == "enc" else "pixels") + 100
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))
    ds = PackedDataset(path, decode="bytes")
    with pytest.raises(CorruptData, match="CRC32C mismatch") as e:
        ds[0]
    assert str(path) in str(e.value) and "sample 0" in str(e.value)
    assert ds[1][1] == 0  # the other samples still read
    r = cli("verify", str(path))
    assert r.exit_code == 1 and "CRC32C mismatch" in r.output
    assert len(open_reader(path, check_crc=False).read(0).data) > 0


def test_truncated_and_foreign_files(packed, tmp_path):
    enc = packed[1]
    cut = tmp_path / "cut.h5"
    cut.write_bytes(enc.read_bytes()[: enc.stat().st_size // 2])
    with pytest.raises(CorruptData, match=str(cut)):
        PackedDataset(cut)
    assert cli("verify", str(cut)).exit_code == 1
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"definitely not hdf5" * 10)
    with pytest.raises(CorruptData, match="no HDF5 signature"):
        open_reader(junk)
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(FormatError, match=MANIFEST_ATTR):
        open_reader(plain)
    future = _copy(enc, tmp_path / "future.h5")
    with h5py.File(future, "r+") as f:
        m = json.loads(f.attrs[MANIFEST_ATTR])
        f.attrs[MANIFEST_ATTR] = json.dumps({**m, "format_version": 99})
    with pytest.raises(FormatError, match="format_version 99"):
        open_reader(future)


def test_damaged_index_is_corrupt_data(packed, tmp_path):
    bad = _copy(packed[1], tmp_path / "bad.h5")
    with h5py.File(bad, "r+") as f:
        f["offsets"][5] = f["blobs"].shape[0] + 10
        labels = f["labels"][:]
        f["labels"].resize((23,))
    reader = open_reader(bad)
    with pytest.raises(CorruptData, match="'labels' holds 23"):
        reader.read(0)
    problems = [str(p) for p in reader.verify_structure()]
    assert problems and "labels" in problems[0]
    with h5py.File(bad, "r+") as f:
        f["labels"].resize((24,))
        f["labels"][:] = labels  # (a changed label is caught by its checksum: test_labels_...)
    reader = open_reader(bad)
    with pytest.raises(CorruptData, match="outside the"):
        reader.read(4)
    assert any("offsets" in str(p) for p in reader.verify_structure())


@pytest.mark.parametrize("pixels", [False, True])
def test_direct_reads_equal_reads_through_hdf5(tmp_path, pixels):
    """Positioned reads from the chunk table (samples crossing chunk boundaries included)
    return what HDF5 itself returns."""
    rng = np.random.default_rng(0)
    shape = (4, 5, 3)
    if pixels:
        samples = [Sample(f"k{i}", rng.integers(0, 256, 60, dtype=np.uint8).tobytes(), "raw", i % 3, *shape)
                   for i in range(30)]
    else:
        samples = [Sample(f"k{i}", rng.integers(0, 256, int(rng.integers(0, 700)), dtype=np.uint8).tobytes(),
                          "jpeg", i % 3, 1, 1, 3) for i in range(30)]
    out = tmp_path / "d.h5"
    w = HDF5Writer(out, classes=["a", "b", "c"], commit_every=7, chunk_bytes=1000,
                   pixels_shape=shape if pixels else None)
    w.open()
    for s in samples:
        w.add(s)
    w.close()
    direct = open_reader(out)
    assert direct._open().parts[0].chunk_offsets is not None  # the fast path is in use
    hdf5 = open_reader(out)
    hdf5._open().parts[0].chunk_offsets = None
    for i, s in enumerate(samples):
        a, b = direct.read(i), hdf5.read(i)
        assert a.data == b.data == s.data and a.label == b.label == s.label


@pytest.mark.parametrize("raw", [False, True])
def test_a_commit_in_small_joins_stores_what_one_join_stores(tmp_path, monkeypatch, raw):
    """A commit's bytes reach HDF5 in joins of at most ``_PIECE_BYTES``: with joins of a few
    samples the stored samples, offsets and CRCs equal those of one join per commit."""
    import packer.formats.hdf5.writer as hw

    rng = np.random.default_rng(3)
    shape = (4, 5, 3)
    samples = [Sample(f"k{i}", (rng.integers(0, 256, 60, dtype=np.uint8).tobytes() if raw
                                else rng.integers(0, 256, int(rng.integers(1, 400)), dtype=np.uint8).tobytes()),
                      "raw" if raw else "jpeg", i % 3, *shape) for i in range(50)]

    def write(out, piece):
        monkeypatch.setattr(hw, "_PIECE_BYTES", piece)
        with HDF5Writer(out, classes=["a", "b", "c"], commit_every=17,
                        pixels_shape=shape if raw else None) as w:
            for s in samples:
                w.add(s)
            w.close()
        r = open_reader(out)
        return [(r.read(i).data, r.read(i).label) for i in range(len(r))], list(r.verify())

    one, problems = write(tmp_path / "one.h5", 1 << 30)
    small, problems_small = write(tmp_path / "small.h5", 250)
    assert one == small == [(s.data, s.label) for s in samples]
    assert problems == problems_small == []
    assert list(hw._pieces(samples, 250)) and all(p for p in hw._pieces(samples, 250))
    assert [s for p in hw._pieces(samples, 250) for s in p] == samples
