"""Streaming record shards from a URL (a local nginx) against the same shards on local disk,
in one run, with ratios.

One generated set of natural-looking JPEGs packed once as records shards and served by a
local nginx (Debian's, started here on 127.0.0.1; see scripts/servers.py). Then, for a
real DataLoader epoch of ``StreamingDataset`` at ``--workers`` workers, decoding every sample
to a uint8 CHW tensor (what training does):

* ``local``   the shards on local disk
* ``cold``    over HTTP with an empty cache (every shard downloaded, prefetch on)
* ``warm``    over HTTP with the cache filled by the cold epoch

Rows are interleaved over ``--reps`` rounds (each cold round with a fresh cache, the order
alternating) and the best round is kept, so load on a shared machine hits every row alike.
The table gives samples per wall second and per CPU second (this process and its DataLoader
workers, which do the downloading, hashing and decoding): on a loaded machine the second is
the faithful one. Then the same three reads in this process alone (no workers, one epoch,
interleaved): CPU per sample, the read path's own cost. Every row shuffles shards and samples
with a ``BUFFER``-sample buffer (spanning a few shards, as the default 4096 does on a real
dataset of 1000-sample shards; here the default would span the whole set). Then:

* ``downloads per shard``: 2 ranks x 2 workers (4 reader processes + their prefetch threads,
  one shared cache folder) read one epoch; nginx's access log counts GETs per shard.
* ``fault run``: the same epoch through nginx's ``/flaky/`` location, where 10% of requests
  get a 503; every sample must come exactly once; retries are counted (cache event log).

    python -m scripts.bench.remote streaming --workdir bench-out/remote   # needs nginx
    python -m scripts.bench.remote --quick streaming
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader


from packer.data import StreamingDataset
from packer.remote import RemoteOptions, RetryPolicy, cache_events
from packer.synth import natural_image
from packer.conversion.options import RunOptions
from scripts.bench.common import run_sections, target
from scripts.servers import start_nginx


BUFFER = 256  # sample shuffle buffer: a few 100-sample shards


def make_dataset(work: Path, count: int, side: int, per_shard: int) -> Path:
    """``count`` JPEGs of ``side``x``side`` in 10 classes, packed as records under work/www/ds."""
    from PIL import Image
    import io

    out = work / "www" / "ds"
    params = work / "www" / "ds.params"  # the workdir is kept: rebuild when the sizes asked differ
    if (out / "packer.json").is_file() and params.is_file() and params.read_text() == f"{count} {side} {per_shard}":
        return out
    shutil.rmtree(out, ignore_errors=True)
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        d = src / f"c{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(natural_image(rng, side, side)).save(buf, "JPEG", quality=90)
        (d / f"{i:06d}.jpg").write_bytes(buf.getvalue())
    from packer.commands.pack_images import pack_images

    pack_images(src, out, format="records", writer_options={"samples_per_shard": per_shard},
                run_options=RunOptions(workers=2))
    params.write_text(f"{count} {side} {per_shard}")
    return out


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def epoch(path, workers: int, batch: int, **kw) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process and its DataLoader workers, samples) of one epoch."""
    ds = StreamingDataset(str(path), decode="tensor", shuffle=True, seed=0, batch_size=batch, rank=0,
                          world_size=1, buffer_size=BUFFER, **kw)
    cpu0 = _cpu()
    start = time.perf_counter()
    n = 0
    it = iter(DataLoader(ds, num_workers=workers, batch_size=batch))
    for images, _ in it:
        n += len(images)
    wall = time.perf_counter() - start
    del it  # the workers exit and are reaped: their CPU time is counted
    gc.collect()
    return wall, _cpu() - cpu0, n


def inproc_cpu(path, **kw) -> float:
    """CPU seconds per sample (this process, all its threads: reads, prefetch, decode) over one
    epoch read with no DataLoader workers."""
    ds = StreamingDataset(str(path), decode="tensor", shuffle=True, seed=0, rank=0, world_size=1,
                          buffer_size=BUFFER, **kw)
    t0 = time.process_time()
    n = sum(1 for _ in ds)
    return (time.process_time() - t0) / n


def _rank_epoch(url: str, cache: str, rank: int, world: int, workers: int, retry: dict, out: str) -> None:
    opts = RemoteOptions(cache_dir=cache, retry=RetryPolicy(**retry))
    ds = StreamingDataset(url, decode="bytes", shuffle=True, seed=1, rank=rank, world_size=world, remote=opts)
    # A spawned process's default start method is spawn; a rank that torchrun starts is a fresh
    # interpreter, whose DataLoader workers start the platform's default way (fork on Linux up to
    # Python 3.13): spawned workers would each import torch again (~2 CPU-s apiece here)
    ctx = mp.get_context(mp.get_all_start_methods()[0]) if workers else None
    got = [int(label) for _, label in DataLoader(ds, num_workers=workers, batch_size=None, multiprocessing_context=ctx)]
    keys = [ds.dataset.keys[i] for i in ds.order()]
    Path(out).write_text(json.dumps({"labels": got, "keys": keys}))


def ranks_run(url: str, cache: Path, work: Path, world: int, workers: int, retry: dict) -> list[list[str]]:
    """``world`` rank processes at once, each with ``workers`` DataLoader workers; their keys."""
    ctx = mp.get_context("spawn")
    procs, outs = [], []
    for r in range(world):
        out = work / f"rank{r}.json"
        outs.append(out)
        procs.append(ctx.Process(target=_rank_epoch, args=(url, str(cache), r, world, workers, retry, str(out))))
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a rank process failed with exit code {p.exitcode}")
    return [json.loads(o.read_text())["keys"] for o in outs]


def hdf5_access(work: Path, server, reads: int = 200) -> dict:
    """Whole-file fetch vs h5py ranged reads through fsspec for ``reads`` random samples."""
    import fsspec
    import h5py

    from packer.commands.pack_images import pack_images
    from packer.remote import open_reader

    h5 = work / "www" / "img.h5"
    if not h5.is_file():
        shutil.rmtree(h5, ignore_errors=True)
        pack_images(work / "src", h5, format="hdf5", run_options=RunOptions(workers=2))
    n = len(open_reader(h5))
    picks = np.random.default_rng(0).choice(n, size=min(reads, n), replace=False).tolist()
    url = server.url("img.h5")

    def count() -> int:
        return sum(1 for r in server.requests() if r[1] == "/d/img.h5")

    cache = work / "cache-h5"
    shutil.rmtree(cache, ignore_errors=True)
    c0, t0 = count(), time.perf_counter()
    reader = open_reader(url, remote=RemoteOptions(cache_dir=cache))
    whole = [reader.read(i).data for i in picks]
    whole_s, whole_req = time.perf_counter() - t0, count() - c0
    c0, t0 = count(), time.perf_counter()
    fs = fsspec.filesystem("http")
    with fs.open(url, "rb", block_size=64 << 10, cache_type="readahead") as f, h5py.File(f, "r") as hf:
        offsets = hf["offsets"][:]
        blobs = hf["blobs"]
        ranged = [blobs[int(offsets[i]):int(offsets[i + 1])].tobytes() for i in picks]
    range_s, range_req = time.perf_counter() - t0, count() - c0
    assert ranged == whole
    return {"reads": len(picks), "mb": h5.stat().st_size / 1e6, "whole_s": whole_s, "whole_req": whole_req,
            "range_s": range_s, "range_req": range_req}


def streaming_main(argv: list[str]) -> dict[str, Any]:
    """Records shards over HTTP (cold, warm cache) against local disk; downloads per shard; HDF5 access."""
    ap = argparse.ArgumentParser(prog="remote.py streaming")
    ap.add_argument("--workdir", default="bench-out/remote")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--side", type=int, default=160)
    ap.add_argument("--per-shard", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fault-reps", type=int, default=2, help="epochs through the flaky location")
    args = ap.parse_args(argv)
    work = Path(args.workdir).resolve()
    local = make_dataset(work, args.count, args.side, args.per_shard)
    shards = sorted(p.name for p in local.glob("*.tfrecord"))
    shutil.rmtree(work / "run", ignore_errors=True)  # a fresh access log: counts are this run's
    server = start_nginx(work / "www", work / "run")
    try:
        url = server.url("ds")
        best: dict[str, float] = {}
        best_cpu: dict[str, float] = {}
        for rep in range(args.reps):
            cache = work / f"cache-{rep}"
            shutil.rmtree(cache, ignore_errors=True)
            rows = [("local", local, {}), ("cold", url, {"cache_dir": cache}), ("warm", url, {"cache_dir": cache})]
            if rep % 2:  # alternate the order (cold must precede warm): drift hits every row alike
                rows = [rows[1], rows[2], rows[0]]
            for name, path, kw in rows:
                seconds, cpu, n = epoch(path, args.workers, args.batch, **kw)
                assert n == args.count, (name, n)
                best[name] = min(best.get(name, float("inf")), seconds)
                best_cpu[name] = min(best_cpu.get(name, float("inf")), cpu)
        # CPU per sample in one process, interleaved: the read path's own cost without the noise
        # of worker scheduling on a shared machine
        per_sample: dict[str, float] = {}
        for rep in range(args.reps):
            cache = work / f"cache-inproc-{rep}"
            shutil.rmtree(cache, ignore_errors=True)
            rows = [("local", local, {}), ("cold", url, {"cache_dir": cache}), ("warm", url, {"cache_dir": cache})]
            if rep % 2:
                rows = [rows[1], rows[2], rows[0]]
            for name, path, kw in rows:
                cpu = inproc_cpu(path, **kw)
                per_sample[name] = min(per_sample.get(name, float("inf")), cpu)
        # one download per shard per node: 2 ranks x 2 workers, one cache
        dist_cache = work / "cache-dist"
        shutil.rmtree(dist_cache, ignore_errors=True)
        before = server.downloads()
        keys = ranks_run(url, dist_cache, work, 2, 2, {})
        after = server.downloads()
        per_shard = [after[f"/d/ds/{s}"] - before[f"/d/ds/{s}"] for s in shards]
        all_keys = sorted(keys[0] + keys[1])
        # fault run: 10% of requests fail
        flaky_cache = work / "cache-flaky"
        shutil.rmtree(flaky_cache, ignore_errors=True)
        flaky_url = server.url("ds", location="flaky")
        exact, events = True, []
        for rep in range(args.fault_reps):  # fresh caches: every shard downloaded through the faults each time
            shutil.rmtree(flaky_cache, ignore_errors=True)
            fkeys = ranks_run(flaky_url, flaky_cache, work, 1, args.workers, {"attempts": 10, "backoff": 0.05})
            exact = exact and sorted(fkeys[0]) == sorted(set(fkeys[0])) and len(fkeys[0]) == args.count
            events += cache_events(flaky_cache)
        failed = sum(1 for r in server.requests() if r[1].startswith("/flaky/") and r[2] == 503)
        total = sum(1 for r in server.requests() if r[1].startswith("/flaky/"))
        retries = sum(e["retries"] for e in events)
        refetches = sum(e["refetches"] for e in events)
        h5 = hdf5_access(work, server)
    finally:
        server.stop()
    rate = {k: args.count / v for k, v in best.items()}
    mb = sum((local / s).stat().st_size for s in shards) / 1e6
    load = os.getloadavg()[0]
    print(f"\n{args.count} JPEGs {args.side}x{args.side}, {len(shards)} shards ({mb:.1f} MB), "
          f"{args.workers} DataLoader workers, batch {args.batch}, shuffle buffer {BUFFER}, decode to tensor, "
          f"best of {args.reps} "
          f"(load average {load:.1f} on {os.cpu_count()} cores at the end)\n")
    cpu = {k: args.count / v for k, v in best_cpu.items()}
    print("| read | samples/s (wall) | vs local disk | samples per CPU-s | vs local disk | target |")
    print("|---|---:|---:|---:|---:|---|")
    for key, label, goal in (("local", "local disk", ""), ("warm", "nginx, warm cache", ">= 0.95x"),
                               ("cold", "nginx, cold cache (prefetch 2)", ">= 0.8x")):
        print(f"| {label} | {rate[key]:.0f} | {rate[key] / rate['local']:.2f}x | {cpu[key]:.0f} | "
              f"{cpu[key] / cpu['local']:.2f}x | {goal} |")
    print()
    print(f"CPU per sample in one process (one epoch, no DataLoader workers, interleaved, best of "
          f"{args.reps}):\n")
    print("| read | CPU ms per sample (read + decode) | vs local disk |")
    print("|---|---:|---:|")
    for key, label in (("local", "local disk"), ("warm", "nginx, warm cache"), ("cold", "nginx, cold cache")):
        print(f"| {label} | {1000 * per_sample[key]:.3f} | {per_sample['local'] / per_sample[key]:.2f}x |")
    print()
    print("| check | result |")
    print("|---|---|")
    print(f"| downloads per shard, 2 ranks x 2 workers, one cache | min {min(per_shard)}, max {max(per_shard)} "
          f"({sum(per_shard)} GETs for {len(shards)} shards) |")
    print(f"| samples across the 2 ranks | {len(all_keys)} ({len(set(all_keys))} distinct of {args.count}) |")
    print(f"| fault run x{args.fault_reps} (/flaky/: {failed} of {total} requests got 503) | every sample exactly "
          f"once: {'yes' if exact else 'NO'}; {retries} retries (+{refetches} hash refetches) over "
          f"{sum(1 for e in events if e.get('downloaded'))} downloads |")
    print()
    print(f"HDF5 over HTTP, {h5['reads']} random samples of a {h5['mb']:.1f} MB file:\n")
    print("| access | seconds | requests |")
    print("|---|---:|---:|")
    print(f"| fetch whole into the cache, then local reads (what packer does) | {h5['whole_s']:.2f} | "
          f"{h5['whole_req']} |")
    print(f"| h5py on an fsspec HTTP file object (ranged reads, 64 KiB blocks) | {h5['range_s']:.2f} | "
          f"{h5['range_req']} |")
    goals = {"warm": 0.95, "cold": 0.8}
    return {"targets": [
        *(target(f"{key} cache vs local disk, DataLoader {args.workers} workers{per}", r[key] / r["local"], goals[key])
          for key in ("warm", "cold") for per, r in (("", rate), (", per CPU-second", cpu))),
        *(target(f"{key} cache vs local disk, CPU per sample in one process", per_sample["local"] / per_sample[key],
                 goals[key]) for key in ("warm", "cold"))]}


def main(argv: list[str] | None = None) -> int:
    """Run the section named on the command line and write the JSON."""
    return run_sections("remote", __doc__, {"streaming": streaming_main}, all_sections=("streaming",), argv=argv,
                        quick={"streaming": ["--count", "40", "--per-shard", "10", "--side", "64", "--reps", "1",
                                             "--fault-reps", "1",
                                             "--workdir", "bench-out/remote-quick"]},
                        notes=["A local nginx on 127.0.0.1; rows interleaved, best of the rounds kept."])


if __name__ == "__main__":
    sys.exit(main())
