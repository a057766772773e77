#!/usr/bin/env python
"""Side-by-side loader benchmark: every packer format against the usual peers, in one run.

One generated dataset (5,000 natural-looking JPEGs of ~0.25 MP in 10 classes, made once into
``--cache-dir``), the same ``decode + resize(256) + center-crop(224) + uint8 CHW`` pipeline
everywhere, ``num_workers`` 0 and 2, batch 64, ``uint8_collate`` for every row:

* ``ceiling``: the encoded bytes held in memory (what decode alone allows);
* ``folder``: the plain ImageFolder tree read file by file (torchvision-ImageFolder style);
* ``packer/<fmt>``: ``PackedDataset`` over every format in ``packer.formats.FORMATS``;
* ``webdataset``: tar shards (``webdataset.ShardWriter`` / ``WebDataset``);
* ``litdata``: ``litdata.optimize`` + ``litdata.StreamingDataset``;
* ``mds``: MosaicML Streaming ``MDSWriter`` + ``streaming.StreamingDataset`` (local dir).

Each row runs with two decodes: ``pillow`` (Pillow full decode, bilinear Resize(256),
CenterCrop(224): the peers' documented default) and ``packer`` (``DecodeResizeCrop``:
DCT-scaled decode when the source is >= 2x the target, libjpeg-turbo via OpenCV, resize of
the cropped square only). The table gives samples/s and each row's ratio to the ceiling (same
decode, same workers) and to the best peer (same decode, same workers), then the issue's
targets, then the host-side cost per batch of the prefetcher's uint8 path against float32
normalization on the CPU.

Peers are benchmark-only (``pip install '.[bench]'``); a peer that is not installed is
reported as such and skipped, never faked. Run::

    python scripts/bench_loaders.py                 # full run, ~5 min on 2 cores
    python scripts/bench_loaders.py --count 200 --steps 3 --peers none   # smoke run
    python scripts/bench_loaders.py --training      # training pipeline: + SPDL, DALI, FFCV
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from packer.data.datasets import PackedDataset
from packer.data.device import IMAGENET_MEAN, IMAGENET_STD, Normalize
from packer.data.device import DevicePrefetcher, uint8_collate
from packer.data.decode import DecodeResizeCrop, PilResizeCrop
from packer.formats import FORMATS, writer_class
from packer.commands.pack_images import pack_images
from packer.conversion.inputs import image_folder
from packer.synth import jpeg_bytes, natural_image

PEERS = ("folder", "webdataset", "litdata", "mds")
SIZE = (432, 576)  # ~0.25 MP, jittered by +-1/8 per image like packer.synth.make_image_folder


# -- data ----------------------------------------------------------------------------------
def _make_one(args: tuple[Path, int, int, int]) -> None:
    root, i, classes, seed = args
    out = root / f"class_{i % classes}" / f"img_{i:05d}.jpg"
    if out.exists():
        return
    rng = np.random.default_rng([seed, i])
    h, w = SIZE
    h += int(rng.integers(-h // 8, h // 8 + 1))
    w += int(rng.integers(-w // 8, w // 8 + 1))
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(jpeg_bytes(natural_image(rng, h, w), 90))
    os.replace(tmp, out)


def make_images(root: Path, count: int, classes: int, seed: int = 0) -> Path:
    """Generate the JPEG tree once (resumable; parallel over the CPUs)."""
    done = root / ".complete"
    if done.exists() and done.read_text() == f"{count} {classes} {seed}":
        return root
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    with multiprocessing.Pool(os.cpu_count() or 1) as pool:
        pool.map(_make_one, [(root, i, classes, seed) for i in range(count)], chunksize=16)
    done.write_text(f"{count} {classes} {seed}")
    print(f"generated {count} JPEGs in {time.perf_counter() - t:.0f} s -> {root}", file=sys.stderr)
    return root


def build_packed(src: Path, cache: Path, name: str) -> Path:
    out = cache / "packed" / (f"data.{name}" if writer_class(name).single_file else name)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        report = pack_images(src, out, format=name, check="header")
        print(f"packed {name}: {report.summary()} ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    return out


def build_webdataset(items, cache: Path) -> list[str]:
    import webdataset as wds

    d = cache / "wds"
    if not (d / ".complete").exists():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        with wds.ShardWriter(str(d / "shard-%05d.tar"), maxcount=625, verbose=0) as sink:
            for it in items:
                sink.write({"__key__": f"{it.label}_{Path(it.key).stem}", "jpg": Path(it.path).read_bytes(),
                            "cls": it.label})
        (d / ".complete").write_text("ok")
    return sorted(str(p) for p in d.glob("shard-*.tar"))


def _litdata_item(pair: tuple[str, int]) -> dict[str, Any]:
    path, label = pair
    return {"image": Path(path).read_bytes(), "label": label}


def build_litdata(items, cache: Path) -> Path:
    import litdata

    d = cache / "litdata"
    if not (d / ".complete").exists():
        shutil.rmtree(d, ignore_errors=True)
        litdata.optimize(fn=_litdata_item, inputs=[(it.path, it.label) for it in items], output_dir=str(d),
                         chunk_bytes="64MB", num_workers=1, verbose=False, start_method="fork")
        (d / ".complete").write_text("ok")
    return d


def build_mds(items, cache: Path) -> Path:
    from streaming import MDSWriter

    d = cache / "mds"
    if not (d / ".complete").exists():
        shutil.rmtree(d, ignore_errors=True)
        with MDSWriter(out=str(d), columns={"image": "bytes", "label": "int"}) as w:
            for it in items:
                w.write({"image": Path(it.path).read_bytes(), "label": it.label})
        (d / ".complete").write_text("ok")
    return d


# -- datasets ------------------------------------------------------------------------------
class InMemory(Dataset):
    """The ceiling: encoded bytes already in memory, same decode."""

    def __init__(self, blobs: list[bytes], labels: list[int], decode: Callable[[Any], Any]):
        self.blobs, self.labels, self.decode = blobs, labels, decode

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):
        return self.decode(self.blobs[i]), self.labels[i]


class Folder(Dataset):
    """ImageFolder style: torchvision's pil_loader (open + convert RGB), or bytes + packer decode."""

    def __init__(self, items, decode: Callable[[Any], Any], pillow: bool):
        self.items, self.decode, self.pillow = items, decode, pillow

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        it = self.items[i]
        with open(it.path, "rb") as f:
            if self.pillow:
                return self.decode(Image.open(f).convert("RGB")), it.label
            return self.decode(f.read()), it.label


class _ImageLabel:
    """A streaming item dict -> (decoded image, label)."""

    def __init__(self, decode: Callable[[Any], Any]):
        self.decode = decode

    def __call__(self, item: dict[str, Any]):
        return self.decode(item["image"]), item["label"]


def loader_factory(kind: str, decode_name: str, env: dict[str, Any]) -> Callable[[int], Any]:
    """A function num_workers -> a fresh loader for one row."""
    pillow = decode_name == "pillow"
    decode = PilResizeCrop(256, 224) if pillow else DecodeResizeCrop(256, 224)
    bs = env["batch_size"]

    def dl(ds, w, shuffle=True):
        return DataLoader(ds, batch_size=bs, shuffle=shuffle, num_workers=w, collate_fn=uint8_collate)

    if kind == "ceiling":
        return lambda w: dl(InMemory(env["blobs"], env["labels"], decode), w)
    if kind == "folder":
        return lambda w: dl(Folder(env["items"], decode, pillow), w)
    if kind.startswith("packer/"):
        path = env["packed"][kind.split("/", 1)[1]]
        return lambda w: dl(PackedDataset(path, decode=decode), w)
    if kind == "webdataset":
        import webdataset as wds

        def make(w):
            ds = wds.WebDataset(env["wds"], shardshuffle=len(env["wds"]), empty_check=False).shuffle(1000)
            if pillow:
                ds = ds.decode("pil")
            ds = ds.to_tuple("jpg", "cls").map_tuple(decode, int)
            return dl(ds, w, shuffle=False)
        return make
    if kind == "litdata":
        import litdata

        def make(w):
            ds = litdata.StreamingDataset(str(env["litdata"]), shuffle=True, transform=_ImageLabel(decode),
                                          cache_dir=str(env["cache"] / "litdata-cache"))
            return litdata.StreamingDataLoader(ds, batch_size=bs, num_workers=w, collate_fn=uint8_collate)
        return make
    if kind == "mds":
        import streaming

        class MDSImages(streaming.StreamingDataset):  # fork start method: never pickled
            def __getitem__(self, idx):
                return _ImageLabel(decode)(super().__getitem__(idx))

        def make(w):
            streaming.base.util.clean_stale_shared_memory()
            ds = MDSImages(local=str(env["mds"]), shuffle=True, batch_size=bs)
            return dl(ds, w, shuffle=False)
        return make
    raise ValueError(kind)


# -- timing --------------------------------------------------------------------------------
def time_loader(loader: Any, steps: int) -> dict[str, float]:
    """First batch (start-up) apart, then ``steps`` batches: samples/s.

    Also the CPU time this process spent per sample: with num_workers=0 all the work is
    here, so it is the row's cost per image, insensitive to other jobs on a shared machine.
    """
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    n, t, cpu = 0, time.perf_counter(), time.process_time()
    for _ in range(steps):
        b = next(it, None)
        if b is None:
            break
        n += len(b[1])
    rate = n / (time.perf_counter() - t)
    cpu_us = 1e6 * (time.process_time() - cpu) / max(n, 1)
    del it
    return {"samples_per_s": rate, "first_batch_s": first, "samples": n, "cpu_us_per_sample": cpu_us}


def _cpu_us_per_item(make_iter: Callable[[], Any], n: int, reps: int = 3) -> float:
    """Least CPU time per item over ``reps`` passes of ``n`` items (in this process)."""
    best = float("inf")
    for _ in range(reps):
        it = make_iter()
        next(it)  # open files / start streams outside the timed part
        t = time.process_time()
        for _ in range(n):
            next(it)
        best = min(best, (time.process_time() - t) / n)
        del it
    return 1e6 * best


def _fetch_iter(kind: str, env: dict[str, Any], order: list[int]):
    """Encoded bytes of ``order`` samples from one source, without decoding."""
    if kind == "ceiling":
        return (env["blobs"][i] for i in order)
    if kind == "folder":
        return (Path(env["items"][i].path).read_bytes() for i in order)
    if kind.startswith("packer/"):
        ds = PackedDataset(env["packed"][kind.split("/", 1)[1]], decode="bytes")
        return (ds[i][0] for i in order)
    if kind == "webdataset":
        import webdataset as wds

        ds = wds.WebDataset(env["wds"], shardshuffle=len(env["wds"]), empty_check=False).shuffle(1000)
        return (jpg for jpg, _ in ds.to_tuple("jpg", "cls"))
    if kind == "litdata":
        import litdata

        return (item["image"] for item in litdata.StreamingDataset(
            str(env["litdata"]), shuffle=True, cache_dir=str(env["cache"] / "litdata-cache")))
    if kind == "mds":
        import streaming

        streaming.base.util.clean_stale_shared_memory()
        ds = streaming.StreamingDataset(local=str(env["mds"]), shuffle=True, batch_size=env["batch_size"])
        return (item["image"] for item in ds)
    raise ValueError(kind)


def component_costs(kinds: list[str], env: dict[str, Any], n: int = 400) -> dict[str, Any]:
    """CPU us per sample of each part, one process, least of 3 passes: fetching the encoded
    bytes from each source, and each decode pipeline on bytes held in memory. These hardly
    move with machine load, and they add up to what a loader costs per image."""
    order = np.random.default_rng(1).permutation(len(env["blobs"]))[: n + 1].tolist()
    blobs = [env["blobs"][i] for i in order]
    decode = {name: _cpu_us_per_item(lambda fn=fn: (fn(b) for b in blobs), n)
              for name, fn in (("packer", DecodeResizeCrop(256, 224)), ("pillow", PilResizeCrop(256, 224)))}
    fetch = {}
    for kind in kinds:
        try:
            fetch[kind] = _cpu_us_per_item(lambda kind=kind: _fetch_iter(kind, env, order), n)
        except Exception as e:
            fetch[kind] = None
            print(f"fetch cost of {kind} not measured: {type(e).__name__}: {e}", file=sys.stderr)
    return {"samples": n, "decode_us": decode, "fetch_us": fetch}


def format_components(c: dict[str, Any], formats: list[str]) -> str:
    d = c["decode_us"]
    lines = [f"CPU cost per sample (one process, least of 3 passes over {c['samples']} samples): decode + "
             f"resize + crop: packer {d['packer']:.0f} us, pillow {d['pillow']:.0f} us "
             f"({d['pillow'] / d['packer']:.2f}x)",
             f"{'source':>16} {'fetch us':>9} {'img/cpu-s packer':>17} {'img/cpu-s pillow':>17}"]
    for kind, f in c["fetch_us"].items():
        if f is None:
            lines.append(f"{kind:>16} {'n/a':>9}")
            continue
        lines.append(f"{kind:>16} {f:>9.0f} {1e6 / (f + d['packer']):>17.0f} {1e6 / (f + d['pillow']):>17.0f}")
    peers = [k for k in c["fetch_us"] if k in PEERS and c["fetch_us"][k] is not None]
    fastest = min(peers, key=lambda k: c["fetch_us"][k]) if peers else None
    for f in formats:
        mine = c["fetch_us"].get(f"packer/{f}")
        if mine is None or fastest is None:
            continue
        cf, ceil = c["fetch_us"][fastest], c["fetch_us"]["ceiling"]
        lines.append(f"  packer/{f} default vs fastest peer ({fastest}) default: "
                     f"{(cf + d['pillow']) / (mine + d['packer']):.2f}x; same decode: "
                     f"{(cf + d['packer']) / (mine + d['packer']):.2f}x; vs ceiling: "
                     f"{(ceil + d['packer']) / (mine + d['packer']):.2f}x")
    return "\n".join(lines)


def host_cost(batch: torch.Tensor, reps: int = 15) -> dict[str, Any]:
    """Host-side cost per batch: the uint8 path against normalizing float32 on the CPU.

    Without CUDA the uint8 path's host work is staging the uint8 batch into a (pinned)
    buffer for the copy engine, measured as a copy into a preallocated buffer; the float
    path normalizes on the CPU and stages 4x the bytes. With CUDA the real prefetcher's
    host time per batch is measured too.
    """
    norm = Normalize(IMAGENET_MEAN, IMAGENET_STD)
    stage_u8 = torch.empty_like(batch)
    stage_f32 = torch.empty(batch.shape, dtype=torch.float32)

    def med(fn):
        fn()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return 1000 * statistics.median(ts)

    out = {"batch_shape": list(batch.shape),
           "uint8_path_ms": med(lambda: stage_u8.copy_(batch)),
           "cpu_float32_ms": med(lambda: stage_f32.copy_(norm(batch))),
           "prefetcher_cpu_fallback_ms": med(lambda: next(iter(DevicePrefetcher([(batch, 0)], device="cpu"))))}
    out["ratio"] = out["uint8_path_ms"] / out["cpu_float32_ms"]
    out["bytes_uint8"] = batch.numel()
    out["bytes_float32"] = 4 * batch.numel()
    if torch.cuda.is_available():  # the real thing: host time spent inside the CUDA prefetcher
        pinned = batch.pin_memory()
        pf = DevicePrefetcher([(pinned, torch.zeros(len(batch), dtype=torch.long))] * (reps + 1), device="cuda")
        it = iter(pf)
        next(it)
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            next(it)
            ts.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        out["cuda_prefetcher_host_ms"] = 1000 * statistics.median(ts)
        out["cuda_device"] = torch.cuda.get_device_name()
    return out


# -- main ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", default="bench-out/loaders", help="where the dataset and packs are kept")
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--steps", type=int, default=30, help="batches timed per row (after the first)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over all rows; the best of each is kept")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma list of peers, or 'none'")
    ap.add_argument("--formats", default=",".join(FORMATS), help="packer formats to include")
    ap.add_argument("--json", default=None, help="write results here (default: CACHE/results.json)")
    ap.add_argument("--training", action="store_true",
                    help="the training pipeline instead (RandomResizedCrop + flip): packer.Loader against "
                         "SPDL, DALI (CPU), FFCV and WebDataset; see scripts/bench_loaders_train.py")
    ap.add_argument("--parallel", type=int, default=2, help="--training: threads or workers per row")
    args = ap.parse_args(argv)
    if args.training:
        return main_training(args)
    torch.set_num_threads(1)
    cache = Path(args.cache_dir) / f"n{args.count}"
    workers = [int(w) for w in args.workers.split(",")]
    peers = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    formats = [f for f in args.formats.split(",") if f in FORMATS]
    src = make_images(cache / "images", args.count, args.classes)
    items, _ = image_folder(src)
    env: dict[str, Any] = {"batch_size": args.batch_size, "items": items, "cache": cache, "packed": {}}
    env["blobs"] = [Path(it.path).read_bytes() for it in items]
    env["labels"] = [it.label for it in items]
    mean_bytes = sum(map(len, env["blobs"])) / len(items)
    skipped: dict[str, str] = {}
    for name in formats:
        env["packed"][name] = build_packed(src, cache, name)
    builders = {"webdataset": ("wds", build_webdataset), "litdata": ("litdata", build_litdata),
                "mds": ("mds", build_mds)}
    for p in [p for p in peers if p in builders]:
        key, fn = builders[p]
        try:
            env[key] = fn(items, cache)
        except Exception as e:  # a peer that cannot be installed or run here is reported, not faked
            skipped[p] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    kinds = ["ceiling"] + [f"packer/{f}" for f in formats] + [p for p in peers if p not in skipped]
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for rnd in range(args.repeats):  # rounds interleave the rows, so load spikes spread over all
        for kind in kinds:
            for decode_name in ("packer", "pillow"):
                factory = loader_factory(kind, decode_name, env)
                for w in workers:
                    try:
                        r = time_loader(factory(w), args.steps)
                    except Exception as e:
                        skipped[f"{kind}/{decode_name}/w{w}"] = f"{type(e).__name__}: {e}"
                        traceback.print_exc()
                        continue
                    r.update(kind=kind, decode=decode_name, num_workers=w, round=rnd)
                    results.append(r)
                    print(f"[{rnd}] {kind:>16} {decode_name:>6} w={w}: {r['samples_per_s']:7.0f} samples/s "
                          f"(first batch {r['first_batch_s']:.2f} s, load {os.getloadavg()[0]:.1f})",
                          file=sys.stderr, flush=True)
    batch = next(iter(DataLoader(InMemory(env["blobs"][:args.batch_size], env["labels"][:args.batch_size],
                                          DecodeResizeCrop(256, 224)), batch_size=args.batch_size,
                                 collate_fn=uint8_collate)))[0]
    cost = host_cost(batch)
    components = component_costs(kinds, env, n=min(400, args.count - 1))
    summary = summarize(results, workers, formats, peers, skipped)
    report = {"count": args.count, "classes": args.classes, "mean_jpeg_bytes": mean_bytes,
              "batch_size": args.batch_size, "steps": args.steps, "repeats": args.repeats,
              "cpu_count": os.cpu_count(),
              "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "torch": torch.__version__,
              "results": results,
              "targets": summary["targets"], "host_cost": cost, "components": components,
              "skipped": skipped}
    out = Path(args.json) if args.json else cache / "results.json"
    out.write_text(json.dumps(report, indent=1))
    print(summary["table"])
    print(format_components(components, formats))
    print(format_host_cost(cost))
    for k, v in skipped.items():
        print(f"skipped {k}: {v}")
    print(f"results: {out}")
    return 0


def main_training(args: argparse.Namespace) -> int:
    """``--training``: every loader with the training transform (see bench_loaders_train.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_loaders_train import TRAIN_PEERS, run_training

    torch.set_num_threads(1)
    cache = Path(args.cache_dir) / f"n{args.count}"
    peers = list(TRAIN_PEERS) if args.peers == ",".join(PEERS) else [p for p in args.peers.split(",") if p]
    formats = [f for f in args.formats.split(",") if f in ("lmdb", "hdf5")]
    src = make_images(cache / "images", args.count, args.classes)
    items, _ = image_folder(src)
    env: dict[str, Any] = {"batch_size": args.batch_size, "items": items, "cache": cache, "images": src,
                           "packed": {name: build_packed(src, cache, name) for name in formats}}
    skipped: dict[str, str] = {}
    if "webdataset" in peers:
        try:
            env["wds"] = build_webdataset(items, cache)
        except Exception as e:
            skipped["webdataset"] = f"{type(e).__name__}: {e}"
    load = os.getloadavg()[0]
    lines = run_training(env, peers, parallel=args.parallel, steps=args.steps, repeats=args.repeats, skipped=skipped)
    print(f"{args.count} JPEGs ({SIZE[0]}x{SIZE[1]} +-1/8), {os.cpu_count()} CPUs, load average {load:.1f} -> "
          f"{os.getloadavg()[0]:.1f}, torch {torch.__version__}")
    print("\n".join(lines))
    return 0


def summarize(results, workers, formats, peers, skipped) -> dict[str, Any]:
    """The table and the issue's targets, on two measures (higher is better for both):
    wall-clock samples/s per num_workers (best round), and samples per CPU-second at
    num_workers=0 (1e6 / CPU us per sample; robust when other jobs load the machine)."""
    metrics: dict[str, dict[tuple[str, str], float]] = {}
    for r in results:  # best round of each row
        for name, value in [(f"w={r['num_workers']}", r["samples_per_s"])] + (
                [("cpu", 1e6 / r["cpu_us_per_sample"])] if r["num_workers"] == 0 else []):
            m = metrics.setdefault(name, {})
            m[(r["kind"], r["decode"])] = max(m.get((r["kind"], r["decode"]), 0.0), value)
    order = [f"w={w}" for w in workers] + ["cpu"]
    peer_kinds = [p for p in peers if p not in skipped]
    kinds = ["ceiling"] + [f"packer/{f}" for f in formats] + peer_kinds

    def best_peer(m, decode):
        vals = [(m[(p, decode)], p) for p in peer_kinds if (p, decode) in m]
        return max(vals) if vals else (None, None)

    head = f"{'loader':>16} {'decode':>6}"
    for name in order:
        unit = "img/s" if name != "cpu" else "img/cpu-s (w=0)"
        head += f" | {name + ' ' + unit:>22} {'/ceil':>6} {'/peer':>6}"
    lines = [head, "-" * len(head)]
    for kind in kinds:
        for decode in ("packer", "pillow"):
            row = f"{kind:>16} {decode:>6}"
            for name in order:
                m = metrics.get(name, {})
                r, c, (bp, _) = m.get((kind, decode)), m.get(("ceiling", decode)), best_peer(m, decode)
                if r is None:
                    row += f" | {'n/a':>22} {'':>6} {'':>6}"
                    continue
                row += f" | {r:>22.0f} {r / c if c else float('nan'):>5.2f}x {r / bp if bp else float('nan'):>5.2f}x"
            lines.append(row)
    targets: dict[str, Any] = {}
    for name in (f"w={max(workers)}", "cpu"):
        m = metrics.get(name, {})
        best = max(((m.get((f"packer/{f}", "packer"), 0.0), f) for f in formats), default=(0.0, None))
        (peer_default, pd), (peer_same, ps) = best_peer(m, "pillow"), best_peer(m, "packer")
        if best[1] and peer_default:
            targets[f"{name}: packer default vs best peer default"] = {
                "value": best[0] / peer_default, "target": 2.0, "who": f"{best[1]} vs {pd}"}  # issue 18
        if best[1] and peer_same:
            targets[f"{name}: packer vs best peer, same decode"] = {
                "value": best[0] / peer_same, "target": 1.0, "who": f"{best[1]} vs {ps}"}
        for f in formats:
            r, c = m.get((f"packer/{f}", "packer")), m.get(("ceiling", "packer"))
            if r and c:
                targets[f"{name}: packer/{f} vs in-memory ceiling"] = {"value": r / c, "target": 0.95}
    lines += ["", "targets (packer decode = DecodeResizeCrop; default peer decode = Pillow):"]
    for k, t in targets.items():
        ok = "met" if t["value"] >= t["target"] else "MISSED"
        who = f" ({t['who']})" if "who" in t else ""
        lines.append(f"  {k}: {t['value']:.2f}x (target >= {t['target']}x) {ok}{who}")
    return {"table": "\n".join(lines), "targets": targets}


def format_host_cost(c: dict[str, Any]) -> str:
    s = (f"host-side cost per batch {tuple(c['batch_shape'])}: uint8 path (stage {c['bytes_uint8'] / 1e6:.1f} MB) "
         f"{c['uint8_path_ms']:.2f} ms vs CPU float32 normalize + stage {c['bytes_float32'] / 1e6:.1f} MB "
         f"{c['cpu_float32_ms']:.2f} ms: {c['ratio']:.2f}x (target <= 0.5x); "
         f"DevicePrefetcher CPU fallback {c['prefetcher_cpu_fallback_ms']:.2f} ms")
    if "cuda_prefetcher_host_ms" in c:
        s += f"; CUDA prefetcher host time {c['cuda_prefetcher_host_ms']:.2f} ms on {c['cuda_device']}"
    else:
        s += "; no CUDA here: the CUDA prefetcher's own host time was not measured"
    return s


if __name__ == "__main__":
    sys.exit(main())
