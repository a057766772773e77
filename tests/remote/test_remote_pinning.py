"""A remote reader is pinned to the version it opened (issue 31, cases 3 and 4), against a real
nginx: a dataset republished at its URL under an open reader gives OutputChanged or the old
data, never a mix, in range and whole-shard mode and when another process refills the node
cache; a cached file is used only as the manifest's sha256 says; ``packer verify URL``
checks the server's bytes, not the cache's."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.data import PackedDataset
from packer.errors import OutputChanged
from packer.remote import RemoteOptions, RetryPolicy, open_reader
from packer.remote.fetch import file_sha256

from tests.support.inputs import write_image_folder
from tests.support.served import pack

COUNT, PER_SHARD = 30, 5
FAST_RETRY = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.02)


def _pack_list(src: Path, out: Path, labels: list[int]) -> Path:
    """``packer to-records --list`` of ``src``'s images (sorted) with ``labels``, into ``out``."""
    images = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.jpg"))
    listing = out.parent / f"{out.name}.list"
    listing.write_text("".join(f"{name} {label}\n" for name, label in zip(images, labels)))
    if out.exists():
        shutil.rmtree(out)
    r = CliRunner().invoke(main, ["to-records", "--list", str(listing), "--root", str(src), str(out),
                                  "--samples-per-shard", str(PER_SHARD), "--workers", "0"])
    assert r.exit_code == 0, r.output
    return out


def _publish(served: Path, built: Path) -> None:
    """Copy a built output over the served folder, file by file, the manifest last (as a careful
    publisher does); the files are rewritten in place under their old names."""
    served.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in built.iterdir() if p.is_file())
    for name in [n for n in names if n != "packer.json"] + ["packer.json"]:
        shutil.copyfile(built / name, served / name)


@pytest.fixture
def dataset(nginx, tmp_path):
    """(url, src, served folder, publish(labels)) of a 30-sample records dataset packed from a list."""
    src = write_image_folder(tmp_path / "src", count=COUNT, seed=3)
    served = nginx.root / f"pin-{tmp_path.name}"

    def publish(labels: list[int]) -> None:
        _publish(served, _pack_list(src, tmp_path / "built", labels))

    publish([i % 3 for i in range(COUNT)])
    yield nginx.url(served.name), src, served, publish
    shutil.rmtree(served, ignore_errors=True)


OLD = [i % 3 for i in range(COUNT)]
SAME_SIZE = [i % 3 + 3 for i in range(COUNT)]  # each record keeps its size (a one-byte varint)
OTHER_SIZE = [i % 3 + 1000 for i in range(COUNT)]  # each record grows by a byte


def _read_rest(ds, start: int, stop: int) -> tuple[list[int], int]:
    """Labels read from ``start`` to ``stop`` (OutputChanged ones left out) and how many raised it."""
    labels, changed = [], 0
    for i in range(start, stop):
        try:
            labels.append(ds[i][1])
        except OutputChanged:
            changed += 1
    return labels, changed


def test_range_reader_raises_output_changed_when_the_url_is_republished(dataset, tmp_path):
    url, _, _, publish = dataset
    ds = PackedDataset(url, decode="bytes", remote=RemoteOptions(cache_dir=tmp_path / "c", access="range"))
    assert [ds[i][1] for i in range(10)] == OLD[:10]
    time.sleep(1.1)  # nginx's ETag and Last-Modified have one-second resolution
    publish(SAME_SIZE)
    labels, changed = _read_rest(ds, 10, COUNT)
    assert changed == COUNT - 10 and labels == []  # no ranged read returns the new version's bytes


@pytest.mark.parametrize("new", [SAME_SIZE, OTHER_SIZE], ids=["same-size", "other-size"])
def test_cache_refilled_by_another_process_never_mixes_versions(dataset, tmp_path, new):
    url, _, _, publish = dataset
    cache = tmp_path / "c"
    ds = PackedDataset(url, decode="bytes", cache_dir=cache)
    assert [ds[i][1] for i in range(10)] == OLD[:10]  # shards 0 and 1 cached and mapped
    publish(new)
    env = dict(os.environ, PACKER_CACHE_DIR=str(cache))  # another rank of the node: `packer verify`
    r = subprocess.run([sys.executable, "-m", "packer", "verify", url], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr  # the new version is whole
    labels, changed = _read_rest(ds, 10, COUNT)
    assert all(label in (0, 1, 2) for label in labels)  # old data where any, never the new labels
    assert changed > 0  # shards 2-5 were never cached for it: the old version is gone
    assert [ds[i][1] for i in range(10)] == OLD[:10]  # the shards it holds stay the old version's
    again = PackedDataset(url, decode="bytes", cache_dir=cache)  # opened again: the new version
    assert [again[i][1] for i in range(COUNT)] == new


def test_a_shard_downloaded_after_a_republish_is_output_changed_not_damage(dataset, tmp_path):
    url, _, _, publish = dataset
    ds = PackedDataset(url, decode="bytes", remote=RemoteOptions(cache_dir=tmp_path / "c", retry=FAST_RETRY))
    assert ds[0][1] == OLD[0]
    publish(OTHER_SIZE)
    with pytest.raises(OutputChanged, match="republished"):  # shard 1 was never fetched: its new bytes
        ds[PER_SHARD]


def test_a_cached_shard_changed_in_the_cache_is_fetched_again(dataset, tmp_path, nginx):
    url, _, served, _ = dataset
    cache = tmp_path / "c"
    first = PackedDataset(url, decode="bytes", cache_dir=cache)
    want = [first[i] for i in range(COUNT)]
    cached = next(cache.glob("*/train-00002.tfrecord"))
    data = bytearray(cached.read_bytes())
    data[200] ^= 0xFF  # the same size, another mtime: what a stray writer or a bad disk leaves
    cached.write_bytes(bytes(data))
    again = PackedDataset(url, decode="bytes", cache_dir=cache)
    assert [again[i] for i in range(COUNT)] == want  # hashed, found wrong, fetched again
    assert nginx.downloads()[f"/d/{served.name}/train-00002.tfrecord"] == 2


def test_verify_url_with_a_warm_cache_checks_the_servers_bytes(dataset, tmp_path):
    url, _, served, _ = dataset
    env = dict(os.environ, PACKER_CACHE_DIR=str(tmp_path / "c"))

    def verify() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "packer", "verify", url], env=env, capture_output=True,
                              text=True, timeout=300)

    cold = verify()
    assert cold.returncode == 0, cold.stdout + cold.stderr
    assert f"OK ({COUNT} samples checked)" in cold.stdout
    shard = served / "train-00003.tfrecord"
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    data[150] ^= 0x01  # one flipped bit on the server; its size and modification time kept
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = verify()  # the cache holds the good copy of that shard
    assert r.returncode == 1, r.stdout + r.stderr
    assert "train-00003.tfrecord" in r.stderr and "sha256" in r.stderr and url in r.stderr
    assert "shards downloaded again" in cold.stdout  # it says how it checked the server's bytes


def test_range_reader_opened_on_a_changed_shard_says_so(dataset, tmp_path):
    url, _, served, _ = dataset
    shard = served / "train-00001.tfrecord"
    shard.write_bytes(shard.read_bytes() + b"\0")  # the server's shard is not the manifest's
    with pytest.raises(Exception, match="train-00001.tfrecord.*bytes on the server"):
        open_reader(url, remote=RemoteOptions(cache_dir=tmp_path / "c", access="range"))


def test_range_reader_over_s3_raises_output_changed_when_republished(s3, tmp_path):
    s3fs = pytest.importorskip("s3fs")
    bucket = f"packer-pin-{tmp_path.name.lower().replace('_', '-')[:40]}"
    s3.make_bucket(bucket)
    fs = s3fs.S3FileSystem(**s3.storage_options)
    src = write_image_folder(tmp_path / "src", count=COUNT, seed=3)

    def publish(labels: list[int]) -> None:  # the manifest last, as over HTTP
        built = _pack_list(src, tmp_path / "built", labels)
        names = sorted(p.name for p in built.iterdir() if p.is_file())
        for name in [n for n in names if n != "packer.json"] + ["packer.json"]:
            fs.put_file(str(built / name), f"{bucket}/ds/{name}")

    publish(OLD)
    opts = RemoteOptions(storage_options=s3.storage_options, cache_dir=tmp_path / "c", access="range")
    ds = PackedDataset(f"s3://{bucket}/ds", decode="bytes", remote=opts)
    assert [ds[i][1] for i in range(10)] == OLD[:10]
    publish(SAME_SIZE)  # S3's ETag is the content's MD5: no wait needed
    labels, changed = _read_rest(ds, 10, COUNT)
    assert changed == COUNT - 10 and labels == []


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_a_cached_file_listed_in_the_hash_list_is_checked_at_every_open(nginx, tmp_path, fmt):
    src = write_image_folder(tmp_path / "src", count=12)
    if fmt == "lmdb":  # packer.sha256 inside the folder, as an upload by packer writes it
        out = pack("lmdb", src, nginx.root / f"pin-{tmp_path.name}.lmdb")
        files = sorted(p for p in out.iterdir() if p.is_file())
        (out / "packer.sha256").write_text("".join(f"{file_sha256(p)}  {p.name}\n" for p in files))
        url, big = nginx.url(out.name), "data.mdb"
    else:  # {file}.sha256 beside a single file
        out = pack("hdf5", src, nginx.root / f"pin-{tmp_path.name}.h5")
        (out.parent / f"{out.name}.sha256").write_text(f"{file_sha256(out)}  {out.name}\n")
        url, big = nginx.url(out.name), out.name
    cache = tmp_path / "c"
    want = [PackedDataset(url, decode="bytes", cache_dir=cache)[i] for i in range(12)]
    cached = next(p for p in cache.rglob(big) if p.is_file())
    data = bytearray(cached.read_bytes())
    at = data.find(want[5][0][100:140])
    assert at > 0
    data[at] ^= 0xFF  # in sample 5's bytes: a bad disk or a stray writer; same size
    cached.write_bytes(bytes(data))
    again = PackedDataset(url, decode="bytes", cache_dir=cache)
    assert [again[i] for i in range(12)] == want
    path = "/d/" + (f"{out.name}/data.mdb" if fmt == "lmdb" else out.name)
    assert nginx.downloads(suffix="")[path] == 2  # fetched again, not read from the damaged copy


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_verify_url_checks_the_servers_lmdb_and_hdf5_bytes_with_a_warm_cache(nginx, tmp_path, fmt):
    """A damaged file on the server (size and modification time kept) under a warm cache:
    ``verify URL`` downloads again and names the problem, never OK from the cached copy."""
    src = write_image_folder(tmp_path / "src", count=12)
    if fmt == "lmdb":
        out = pack("lmdb", src, nginx.root / f"ver-{tmp_path.name}.lmdb")
        files = sorted(p for p in out.iterdir() if p.is_file())
        (out / "packer.sha256").write_text("".join(f"{file_sha256(p)}  {p.name}\n" for p in files))
        url, served = nginx.url(out.name), out / "data.mdb"
    else:
        out = pack("hdf5", src, nginx.root / f"ver-{tmp_path.name}.h5")
        (out.parent / f"{out.name}.sha256").write_text(f"{file_sha256(out)}  {out.name}\n")
        url, served = nginx.url(out.name), out
    env = dict(os.environ, PACKER_CACHE_DIR=str(tmp_path / "c"))

    def verify() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "packer", "verify", url], env=env, capture_output=True,
                              text=True, timeout=300)

    cold = verify()
    assert cold.returncode == 0 and "OK (12 samples checked)" in cold.stdout, cold.stdout + cold.stderr
    assert "downloaded again into a scratch cache" in cold.stdout
    st = served.stat()
    data = bytearray(served.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit on the server; size and modification time kept
    served.write_bytes(bytes(data))
    os.utime(served, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = verify()  # the node cache still holds the good copy
    assert r.returncode == 1, r.stdout + r.stderr
    assert "sha256" in r.stderr, r.stderr
