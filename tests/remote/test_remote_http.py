"""Reading packed outputs over HTTP from a real nginx: the cache, faults, and the readers."""
from __future__ import annotations

import logging
import os
import threading
import time

import pytest
import torch
from click.testing import CliRunner

from packer.cli import main
from packer.data import PackedDataset, StreamingDataset
from packer.errors import CorruptData, PackerError
from packer.remote import open_reader
from packer.remote import RemoteOptions, RetryPolicy, cache_events
from tests.support.inputs import write_image_folder
from tests.support.served import pack, records_dataset
from scripts.timing import scaled

# xdist: the nginx tests share one worker, so nginx (a session fixture) starts once
pytestmark = pytest.mark.xdist_group("nginx")


FAST_RETRY = RetryPolicy(attempts=25, backoff=0.01, max_backoff=0.05)


def _bytes_all(ds) -> list:
    return [ds[i] for i in range(len(ds))]


def test_records_over_http_match_local_and_download_each_shard_once(nginx, tmp_path):
    local = records_dataset(nginx.root, "plain")
    cache = tmp_path / "cache"
    remote = PackedDataset(nginx.url("plain"), decode="bytes", cache_dir=cache)
    assert _bytes_all(remote) == _bytes_all(PackedDataset(local, decode="bytes"))
    assert remote.keys == PackedDataset(local).keys
    again = PackedDataset(nginx.url("plain"), decode="bytes", cache_dir=cache)  # warm: no new download
    assert _bytes_all(again) == _bytes_all(remote)
    got = {uri: n for uri, n in nginx.downloads().items() if uri.startswith("/d/plain/")}
    assert len(got) == 6 and set(got.values()) == {1}
    assert all(not e["refetches"] for e in cache_events(cache))


def test_inspect_and_verify_accept_urls(nginx, tmp_path, monkeypatch):
    records_dataset(nginx.root, "cli")
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    r = CliRunner().invoke(main, ["inspect", nginx.url("cli")])
    assert r.exit_code == 0, r.output
    assert "records" in r.output and "40 samples" in r.output
    r = CliRunner().invoke(main, ["verify", nginx.url("cli")])
    assert r.exit_code == 0, r.output
    assert "OK (40 samples checked)" in r.output


def test_verify_over_http_reports_a_changed_shard(nginx, tmp_path):
    local = records_dataset(nginx.root, "changed")
    shard = local / "train-00002.tfrecord"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    opts = RemoteOptions(cache_dir=tmp_path / "c", retry=RetryPolicy(attempts=2, backoff=0.01))
    reader = open_reader(nginx.url("changed"), remote=opts)
    problems = [str(p) for p in reader.verify_structure()]
    assert any("train-00002.tfrecord" in p and "sha256" in p for p in problems), problems
    assert any(nginx.url("changed") in p for p in problems)


def test_altered_download_is_caught_by_the_hash_and_fetched_again(nginx, tmp_path):
    local = records_dataset(nginx.root, "altered")
    shard = local / "train-00001.tfrecord"
    good = shard.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x55
    shard.write_bytes(bytes(bad))
    uri = "/d/altered/train-00001.tfrecord"

    def restore_after_first_download():  # the server's copy is fixed once the bad one was served
        deadline = time.monotonic() + scaled(30)
        while time.monotonic() < deadline and not nginx.downloads().get(uri):
            time.sleep(0.005)
        tmp = shard.with_name(".restore")
        tmp.write_bytes(good)
        os.replace(tmp, shard)

    t = threading.Thread(target=restore_after_first_download)
    t.start()
    opts = RemoteOptions(cache_dir=tmp_path / "c", retry=RetryPolicy(attempts=5, backoff=0.3, max_backoff=0.3))
    ds = PackedDataset(nginx.url("altered"), decode="bytes", remote=opts)
    got = ds[8]  # shard 1 holds samples 7..13
    t.join()
    assert got == PackedDataset(local, decode="bytes")[8]
    assert nginx.downloads()[uri] == 2
    events = [e for e in cache_events(tmp_path / "c") if e["file"] == "train-00001.tfrecord"]
    assert len(events) == 1 and events[0]["refetches"] == 1


def test_truncated_download_for_good_is_corrupt_data_naming_the_url(nginx, tmp_path):
    local = records_dataset(nginx.root, "truncated")
    shard = local / "train-00003.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-50])
    opts = RemoteOptions(cache_dir=tmp_path / "c", retry=RetryPolicy(attempts=2, backoff=0.01))
    ds = PackedDataset(nginx.url("truncated"), decode="bytes", remote=opts)
    with pytest.raises(CorruptData, match="truncated") as e:
        ds[22]
    assert nginx.url("truncated/train-00003.tfrecord") in str(e.value)
    assert not list((tmp_path / "c").rglob("train-00003.tfrecord"))  # nothing bad landed


def test_missing_shard_is_a_packer_error_naming_the_url(nginx, tmp_path):
    local = records_dataset(nginx.root, "missing")
    (local / "train-00004.tfrecord").unlink()
    ds = PackedDataset(nginx.url("missing"), decode="bytes", cache_dir=tmp_path / "c")
    assert ds[0][1] == PackedDataset(local, decode="bytes")[0][1]
    with pytest.raises(PackerError, match="not found") as e:
        ds[30]
    assert nginx.url("missing/train-00004.tfrecord") in str(e.value)
    with pytest.raises(PackerError, match="not a packed dataset"):
        open_reader(nginx.url("no-such-dataset"), remote=RemoteOptions(cache_dir=tmp_path / "c"))


def test_credentials_never_appear_in_errors_or_logs(nginx, tmp_path, caplog):
    records_dataset(nginx.root, "creds")
    (nginx.root / "creds" / "train-00000.tfrecord").unlink()
    password, token = "hunter2-password", "sEcReT-tOkEn-123"
    caplog.set_level(logging.DEBUG)
    texts = []
    with_user = nginx.url("creds").replace("http://", f"http://alice:{password}@")
    with_header = RemoteOptions(cache_dir=tmp_path / "c2", retry=RetryPolicy(attempts=2, backoff=0.01),
                                storage_options={"headers": {"Authorization": f"Bearer {token}"}})
    for url, opts in ((with_user, RemoteOptions(cache_dir=tmp_path / "c1", retry=RetryPolicy(attempts=2))),
                      (nginx.url("creds"), with_header)):
        ds = PackedDataset(url, decode="bytes", remote=opts)
        with pytest.raises(PackerError) as e:
            ds[0]  # the missing shard
        texts.append(str(e.value))
        with pytest.raises(PackerError) as e:
            open_reader(url + "-nope", remote=opts)
        texts.append(str(e.value))
        texts.append(repr(opts))
    assert "not found" in texts[0]
    texts.append(caplog.text)
    assert "127.0.0.1" in caplog.text  # the logs were captured
    for text in texts:
        assert password not in text and token not in text and "alice" not in text, text


def test_flaky_server_epoch_is_exact_with_two_workers(nginx, tmp_path):
    local = records_dataset(nginx.root, "flaky", count=60)
    opts = RemoteOptions(cache_dir=tmp_path / "c", retry=FAST_RETRY)
    ds = StreamingDataset(nginx.url("flaky", location="faulty"), decode="bytes", shuffle=False, remote=opts,
                          rank=0, world_size=1)
    keys = PackedDataset(local).keys
    loader = torch.utils.data.DataLoader(ds, num_workers=2, batch_size=None)
    got = [data for data, _ in loader]
    want = [PackedDataset(local, decode="bytes")[i][0] for i in range(60)]
    assert sorted(got) == sorted(want) and len(got) == len(keys)
    events = cache_events(tmp_path / "c")
    shard_events = [e for e in events if e["file"].endswith(".tfrecord")]
    assert len(shard_events) == 9  # one download per shard across both workers
    failed = [r for r in nginx.requests() if r[1].startswith("/faulty/flaky/") and r[2] == 503]
    assert failed, "the faulty location returned no 503: the test tested nothing"


def test_cache_limit_evicts_least_recently_used(nginx, tmp_path):
    local = records_dataset(nginx.root, "lru", count=40)
    one = (local / "train-00000.tfrecord").stat().st_size
    cache = tmp_path / "c"
    ds = PackedDataset(nginx.url("lru"), decode="bytes", cache_dir=cache, cache_limit=int(2.5 * one))
    assert _bytes_all(ds) == _bytes_all(PackedDataset(local, decode="bytes"))
    held = sorted(p.name for p in cache.rglob("*.tfrecord"))
    assert held == ["train-00004.tfrecord", "train-00005.tfrecord"]  # the two most recently used


def test_range_access_reads_records_without_downloading_shards(nginx, tmp_path):
    local = records_dataset(nginx.root, "ranged")
    ds = PackedDataset(nginx.url("ranged"), decode="bytes", remote=RemoteOptions(cache_dir=tmp_path / "c",
                                                                                 access="range"))
    assert [ds[i] for i in (0, 17, 39)] == [PackedDataset(local, decode="bytes")[i] for i in (0, 17, 39)]
    assert not list((tmp_path / "c").rglob("*.tfrecord"))
    ranged = [r for r in nginx.requests() if r[0] == "GET" and r[1].startswith("/d/ranged/train-")
              and r[1].endswith(".tfrecord")]  # (and one HEAD per shard at open: the pins)
    assert ranged and all(r[2] == 206 and r[4].startswith("bytes=") for r in ranged)


@pytest.mark.parametrize("fmt,name", [("lmdb", "img.lmdb"), ("hdf5", "img.h5")])
def test_lmdb_and_hdf5_are_fetched_whole(nginx, tmp_path, fmt, name):
    src = write_image_folder(tmp_path / "src", count=12)
    out = pack(fmt, src, nginx.root / f"{fmt}-{name}")
    ds = PackedDataset(nginx.url(out.name), decode="bytes", cache_dir=tmp_path / "c")
    assert _bytes_all(ds) == _bytes_all(PackedDataset(out, decode="bytes"))


def test_frame_folders_are_refused_with_advice(nginx, tmp_path):
    d = nginx.root / "frames-out"
    d.mkdir()
    (d / "packer.json").write_text('{"format": "frames", "format_version": 1, "count": 0}')
    with pytest.raises(PackerError, match="records"):
        open_reader(nginx.url("frames-out"), remote=RemoteOptions(cache_dir=tmp_path / "c"))


def test_a_stalled_transfer_times_out_and_the_retries_are_bounded(nginx, tmp_path):
    records_dataset(nginx.root, "stalled")
    opts = RemoteOptions(cache_dir=tmp_path / "c", retry=RetryPolicy(attempts=3, backoff=0.01, timeout=0.3))
    start = time.monotonic()
    with pytest.raises(PackerError, match="gave up after 3 attempts") as e:
        PackedDataset(nginx.url("stalled", location="slow"), remote=opts)  # 1 KB/s: stalls > 0.3 s
    assert time.monotonic() - start < scaled(15)  # bounded: not retrying without end
    assert "Timeout" in str(e.value) and nginx.url("stalled/packer.json", location="slow") in str(e.value)


def test_prefetch_fetches_the_next_shards_of_the_epoch_order_and_no_further(nginx, tmp_path):
    records_dataset(nginx.root, "prefetch", count=40, per_shard=5)  # 8 shards
    cache = tmp_path / "c"
    ds = StreamingDataset(nginx.url("prefetch"), decode="bytes", shuffle=True, seed=5, buffer_size=1,
                          rank=0, world_size=1, remote=RemoteOptions(cache_dir=cache, prefetch=2))
    seq = list(dict.fromkeys(i // 5 for i in ds.order()))
    assert seq != sorted(seq)  # a shuffled shard order, so "next" means the epoch's order

    def cached(k):
        return any(cache.rglob(f"train-{k:05d}.tfrecord"))

    it = iter(ds)
    next(it)  # reading shard seq[0]
    deadline = time.monotonic() + scaled(20)
    while not (cached(seq[1]) and cached(seq[2])) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cached(seq[1]) and cached(seq[2])
    time.sleep(0.5)
    assert not any(cached(k) for k in seq[3:])  # at most 2 ahead of the shard being read
    assert len(list(it)) == 39
    assert all(cached(k) for k in seq)


def test_verify_over_http_reports_a_missing_shard(nginx, tmp_path, monkeypatch):
    local = records_dataset(nginx.root, "verify-missing")
    (local / "train-00005.tfrecord").unlink()
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    r = CliRunner().invoke(main, ["verify", nginx.url("verify-missing")])
    assert r.exit_code == 1, r.output
    assert nginx.url("verify-missing/train-00005.tfrecord") in r.output and "missing shard" in r.output


def test_frames_packed_as_records_read_as_videos_over_http(nginx, tmp_path, monkeypatch):
    from tests.support.inputs import write_video

    from packer.data import PackedVideoDataset

    for i in range(3):
        write_video(tmp_path / "videos" / f"c{i % 2}" / f"v{i}.mp4", frames=8 + i, seed=i)
    out = nginx.root / "frames-records"
    r = CliRunner().invoke(main, ["decode-frames", str(tmp_path / "videos"), str(out), "--to", "records",
                                  "--workers", "0"])
    assert r.exit_code == 0, r.output
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))  # the default cache folder
    remote = PackedVideoDataset(nginx.url("frames-records"), clip_len=4, seed=0)
    local = PackedVideoDataset(out, clip_len=4, seed=0)
    assert len(remote) == len(local) == 3 and remote.keys == local.keys
    for i in range(3):
        (a, la), (b, lb) = remote[i], local[i]
        assert la == lb and torch.equal(a, b)


def test_an_hdf5_rewritten_at_the_same_url_is_not_read_from_the_stale_cache(nginx, tmp_path):
    """A single-file output has no manifest to compare: its identity (the uploaded hash list,
    else the server's size and modification stamp) is checked at every open."""
    out = nginx.root / "rewritten.h5"
    pack("hdf5", write_image_folder(tmp_path / "a", count=6, seed=1), out)
    cache = tmp_path / "c"
    first = _bytes_all(PackedDataset(nginx.url(out.name), decode="bytes", cache_dir=cache))
    os.remove(out)
    time.sleep(1.1)  # a new Last-Modified second
    pack("hdf5", write_image_folder(tmp_path / "b", count=9, seed=2), out)
    again = _bytes_all(PackedDataset(nginx.url(out.name), decode="bytes", cache_dir=cache))
    assert again == _bytes_all(PackedDataset(out, decode="bytes")) and again != first
