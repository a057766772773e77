#!/usr/bin/env python
"""The GPU path's device check (issues 34, 45): the CUDA tests' results and five measurements, as JSON.

``scripts/device_check.sh OUTDIR`` runs the tests and then this script; by hand::

    python scripts/device_check.py --out OUTDIR [--junit OUTDIR/tests.xml] [--device cpu]

Writes ``OUTDIR/report.json`` (rewritten after every step, so a run stopped by its time limit
still leaves the steps it finished) and prints a summary. On the CUDA device when there is one,
else the same steps on the CPU fallback with small sizes (``"device": "cpu"``, ``"cuda": false``;
the targets are GPU targets and are then not judged: ``"met": null``):

1. ``host_cost``: host time of the prefetcher's ``next()`` per batch (batches pinned by the
   loader, and pageable ones it pins itself) against CPU normalization of the same batch.
   Target <= 0.5x.
2. ``normalize``: images/s normalized on the device against the CPU, uint8 224 x 224 batches of
   256 (float32; bfloat16 + channels-last on the device for reference). Target >= 10x.
3. ``h2d``: GB/s of uint8 batches moved by the prefetcher (no normalization) against plain
   ``copy_(pinned, non_blocking=True)`` into one device buffer.
4. ``step_loop``: a small ResNet-style training step (bf16 autocast, channels-last on CUDA) fed
   by the prefetcher from (a) batches held in memory and (b) ``packer.data.Loader`` over an LMDB of
   synthetic JPEGs decoded to 224; the model alone and the loader alone set the two sides'
   speeds. ``wait_fraction`` = 1 - (model alone) / (loop): the share of the loop the GPU waits
   for data. Target < 5% where the loader alone is faster than the model ("fast enough on
   paper"); ``bottleneck`` names the slower side.
5. ``gpu_decode`` (issue 45): ``GpuImageDecode`` (nvJPEG) on batches of JPEG bytes against
   DataLoader workers (all cores) running ``DecodeRandomResizedCrop``, images per wall and per
   CPU second, host CPU ms per batch, and its pixels against the CPU transform's; ``GpuClipDecode``
   (NVDEC) on TSN-8 and dense-32 clips of a ``pack-videos`` LMDB against the CPU path and against
   decoding the source MP4s (mmaction2's PyAVDecode way), clips per wall and per CPU second, and
   the frames against the CPU path's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from packer.conversion.options import RunOptions

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packer.data import DecodeResizeCrop, DevicePrefetcher, Loader, PackedDataset  # noqa: E402
from packer.data.device import Normalize  # noqa: E402

TARGETS = {"host_cost": 0.5, "normalize": 10.0, "wait": 0.05}
GPU_SIZES = {"batch": 256, "size": 224, "batches": 8, "cpu_reps": 3, "dev_reps": 20, "steps": 20,
             "images": 512, "jpeg": (256, 320), "resize": 256, "width": 64, "threads": None,
             "decode_jpeg": (375, 500), "decode_images": 1024, "decode_batch": 256, "decode_passes": 3,
             "decode_workers": os.cpu_count(), "decode_videos": 8, "decode_repeats": 4, "clip_batch": 8}
# Without CUDA: small, and one torch thread (intra-op threads on a busy 2-core CI box thrash).
CPU_SIZES = {"batch": 8, "size": 48, "batches": 3, "cpu_reps": 20, "dev_reps": 20, "steps": 3,
             "images": 32, "jpeg": (64, 80), "resize": 56, "width": 16, "threads": 1,
             "decode_jpeg": (96, 128), "decode_images": 16, "decode_batch": 8, "decode_passes": 1,
             "decode_workers": 0, "decode_videos": 1, "decode_repeats": 1, "clip_batch": 2}


# -- timing helpers ------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Median seconds of ``fn`` (after one warm-up), the device synchronized around each call."""
    fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def one_thread(fn: Callable[[], float]) -> float:
    """``fn()`` with torch's intra-op threads set to 1 (as in a DataLoader worker)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def host_batches(sizes: dict, pinned: bool, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    n, s = sizes["batch"], sizes["size"]
    out = []
    for _ in range(sizes["batches"]):
        x = torch.randint(0, 256, (n, 3, s, s), dtype=torch.uint8, generator=g)
        y = torch.randint(0, 1000, (n,), generator=g)
        out.append((x.pin_memory(), y.pin_memory()) if pinned else (x, y))
    return out


def judge(value: float | None, target: float, device: torch.device, below: bool) -> bool | None:
    if device.type != "cuda" or value is None:
        return None
    return value <= target if below else value >= target


# -- 1. host cost ----------------------------------------------------------------------------------
def host_cost(device: torch.device, sizes: dict) -> dict:
    """Host seconds per prefetcher ``next()`` vs CPU normalization of the same batch."""
    pinned = device.type == "cuda"
    norm = Normalize()
    batch = host_batches(sizes, pinned=False)[0][0]
    cpu_s = timed(lambda: norm(batch), torch.device("cpu"), sizes["cpu_reps"])
    cpu1_s = one_thread(lambda: timed(lambda: norm(batch), torch.device("cpu"), sizes["cpu_reps"]))
    out: dict[str, Any] = {"batch": list(batch.shape), "cpu_threads": torch.get_num_threads(),
                           "cpu_normalize_ms": cpu_s * 1e3, "cpu_normalize_one_thread_ms": cpu1_s * 1e3}
    for name, pin in (("pinned", pinned), ("pageable", False)):
        if name == "pinned" and not pinned:
            continue
        batches = host_batches(sizes, pinned=pin)
        per = []
        for _ in range(2):  # the first pass warms the allocators
            it = iter(DevicePrefetcher(batches, device=device))
            per = []
            while True:
                t0 = time.perf_counter()
                try:
                    b = next(it)
                except StopIteration:
                    break
                per.append(time.perf_counter() - t0)
                del b
            sync(device)
        host_s = statistics.median(per[1:] or per)  # the first next() stages two batches
        out[f"prefetcher_{name}_ms"] = host_s * 1e3
        out[f"{name}_ratio"] = host_s / cpu_s
    key = "pinned_ratio" if pinned else "pageable_ratio"
    out["ratio"] = out[key]
    out["target"] = f"<= {TARGETS['host_cost']}x (batches pinned by the loader)"
    out["met"] = judge(out["ratio"], TARGETS["host_cost"], device, below=True)
    if device.type != "cuda":
        out["note"] = "no CUDA: the prefetcher normalizes on the host, so its host cost is the normalization"
    return out


# -- 2. normalization throughput ----------------------------------------------------------------
def normalize_throughput(device: torch.device, sizes: dict) -> dict:
    x = host_batches(sizes, pinned=False)[0][0]
    n = x.shape[0]
    norm = Normalize()
    cpu_s = timed(lambda: norm(x), torch.device("cpu"), sizes["cpu_reps"])
    cpu1_s = one_thread(lambda: timed(lambda: norm(x), torch.device("cpu"), sizes["cpu_reps"]))
    xd = x.to(device)
    dev_s = timed(lambda: norm(xd), device, sizes["dev_reps"])
    fast = Normalize(dtype=torch.bfloat16, channels_last=True)
    dev_bf16_s = timed(lambda: fast(xd), device, sizes["dev_reps"])
    speedup = cpu_s / dev_s
    return {"batch": list(x.shape), "cpu_threads": torch.get_num_threads(),
            "cpu_images_per_s": n / cpu_s, "cpu_one_thread_images_per_s": n / cpu1_s,
            "device_images_per_s": n / dev_s,
            "device_bf16_channels_last_images_per_s": n / dev_bf16_s, "speedup": speedup,
            "target": f">= {TARGETS['normalize']}x", "met": judge(speedup, TARGETS["normalize"], device, below=False)}


# -- 3. host-to-device bandwidth -------------------------------------------------------------------
def h2d(device: torch.device, sizes: dict) -> dict:
    batches = host_batches(sizes, pinned=device.type == "cuda")
    nbytes = sum(x.numel() for x, _ in batches)
    dst = torch.empty_like(batches[0][0], device=device)

    def plain() -> None:
        for x, _ in batches:
            dst.copy_(x, non_blocking=True)

    def prefetched() -> None:
        for images, _ in DevicePrefetcher(batches, device=device, fields=()):
            del images

    def normalized() -> None:
        for images, _ in DevicePrefetcher(batches, device=device):
            del images

    plain_s = timed(plain, device, 3)
    pf_s = timed(prefetched, device, 3)
    norm_s = timed(normalized, device, 3)
    out = {"bytes_per_pass": nbytes, "plain_pinned_copy_gb_s": nbytes / plain_s / 1e9,
           "prefetcher_gb_s": nbytes / pf_s / 1e9, "prefetcher_normalized_gb_s": nbytes / norm_s / 1e9,
           "ratio": plain_s / pf_s}
    if device.type != "cuda":
        out["note"] = ("no CUDA: 'plain' is a host memcpy and the prefetcher hands host batches over "
                       "without a copy, so these are not bandwidths")
    return out


# -- 4. the step loop --------------------------------------------------------------------------------
class Block(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm, plus the shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.short(x))


def small_resnet(width: int = 64, classes: int = 1000) -> nn.Module:
    """ResNet-10-ish: the ResNet stem, one basic block per stage (``width`` x 1, 2, 4, 8 channels)."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                               nn.MaxPool2d(3, 2, 1)]
    cin = width
    for cout, stride in ((width, 1), (2 * width, 2), (4 * width, 2), (8 * width, 2)):
        layers.append(Block(cin, cout, stride))
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def synthetic_lmdb(root: Path, sizes: dict) -> Path:
    """An LMDB of ``images`` synthetic photo-like JPEGs (64 distinct ones, repeated), 10 classes."""
    from packer.commands.pack_images import pack_images
    from packer.synth import jpeg_bytes, natural_image

    rng = np.random.default_rng(0)
    h, w = sizes["jpeg"]
    distinct = [jpeg_bytes(natural_image(rng, h, w)) for _ in range(min(64, sizes["images"]))]
    src = root / "src"
    for i in range(sizes["images"]):
        d = src / f"class_{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:05d}.jpg").write_bytes(distinct[i % len(distinct)])
    out = root / "lmdb"
    pack_images(src, out, format="lmdb", run_options=RunOptions(workers=0))  # in this process: no fork after CUDA started
    return out


def repeat(loader: Iterable[Any], steps: int) -> Iterator[Any]:
    """``steps`` batches of ``loader``, over as many passes as it takes."""
    done = 0
    while done < steps:
        for batch in loader:
            yield batch
            done += 1
            if done == steps:
                return


def step_loop(device: torch.device, sizes: dict, workdir: Path) -> dict:
    cuda = device.type == "cuda"
    n, s, steps = sizes["batch"], sizes["size"], sizes["steps"]
    model = small_resnet(sizes["width"]).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dtype = torch.bfloat16 if cuda else torch.float32

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def loop(batches: Iterable[Any]) -> tuple[float, float]:
        """(seconds for the steps, host seconds spent in the prefetcher's next())"""
        sync(device)
        t0 = time.perf_counter()
        waited = 0.0
        it = iter(DevicePrefetcher(batches, device=device, dtype=dtype, channels_last=True))
        while True:
            t1 = time.perf_counter()
            try:
                images, labels = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - t1
            step(images, labels)
        sync(device)
        return time.perf_counter() - t0, waited

    x = torch.randint(0, 256, (n, 3, s, s), dtype=torch.uint8)
    xd = Normalize(dtype=dtype, channels_last=True)(x.to(device))
    yd = torch.randint(0, 1000, (n,), device=device)
    for _ in range(3):
        step(xd, yd)
    model_s = timed(lambda: [step(xd, yd) for _ in range(steps)], device, 1)

    held = host_batches(dict(sizes, batches=4), pinned=cuda)
    loop(repeat(held, 3))
    mem_s, mem_wait = loop(repeat(held, steps))

    lmdb = synthetic_lmdb(workdir, sizes)
    dataset = PackedDataset(lmdb, decode=DecodeResizeCrop(sizes["resize"], s))
    threads = min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    loader = Loader(dataset, batch_size=n, shuffle=True, drop_last=True, num_threads=threads)  # the whole box
    for _ in repeat(loader, 2):
        pass
    t0 = time.perf_counter()
    for _ in repeat(loader, steps):
        pass
    loader_s = time.perf_counter() - t0
    loop(repeat(loader, 2))
    real_s, real_wait = loop(repeat(loader, steps))

    def share(total: float) -> float:
        return max(0.0, 1.0 - model_s / total)

    fast_enough = loader_s <= model_s
    wait = share(real_s)
    return {
        "model": "ResNet-10-style (stem + 4 basic blocks)", "width": sizes["width"], "batch": [n, 3, s, s], "steps": steps,
        "dtype": str(dtype).replace("torch.", ""), "loader_threads": loader.num_threads,
        "model_alone_ms_per_step": model_s / steps * 1e3,
        "loader_alone_ms_per_batch": loader_s / steps * 1e3,
        "in_memory": {"ms_per_step": mem_s / steps * 1e3, "wait_fraction": share(mem_s),
                      "host_next_ms_per_step": mem_wait / steps * 1e3,
                      "met": judge(share(mem_s), TARGETS["wait"], device, below=True)},
        "loader": {"ms_per_step": real_s / steps * 1e3, "wait_fraction": wait,
                   "host_next_ms_per_step": real_wait / steps * 1e3},
        "loader_fast_enough": fast_enough,
        "bottleneck": "device (the model step)" if fast_enough else "loader (the CPU side)",
        "target": f"wait < {TARGETS['wait']:.0%} when the loader alone is faster than the model",
        "met": judge(wait, TARGETS["wait"], device, below=True) if fast_enough else None,
    }


# -- 5. GPU decode (issue 45) -----------------------------------------------------------------------
VIDEO_FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "videos" / "mmaction2_test.mp4"


def cpu_seconds() -> float:
    """CPU seconds of this process and of its reaped children (loader workers once they exit)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measured(run: Callable[[], int], device: torch.device) -> dict:
    """``run()`` (returns the items it produced) timed: items per wall second and per CPU second."""
    sync(device)
    t0, c0 = time.perf_counter(), cpu_seconds()
    n = run()
    sync(device)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return {"items": n, "per_s": n / wall, "per_cpu_s": n / cpu if cpu > 0 else None, "wall_s": round(wall, 3)}


def _drain(loader: Iterable[Any], fn: Callable[[Any], torch.Tensor]) -> int:
    n = 0
    for batch in loader:
        n += len(fn(batch))
    return n


def gpu_decode(device: torch.device, sizes: dict, workdir: Path) -> dict:
    """nvJPEG and NVDEC (``packer.data.gpu``) against the CPU path on this machine's cores:
    correctness on the measured data, images/s and clips/s per wall and per CPU second."""
    from torch.utils.data import DataLoader, Subset

    from packer.api import pack_videos
    from packer.data import DecodeRandomResizedCrop, PackedVideoDataset, PilRandomResizedCrop
    from packer.data.gpu import GpuClipDecode, GpuImageDecode, nvdec_available, nvjpeg_available
    from packer.data.video import collate_clips

    workers = sizes["decode_workers"] or 0
    out: dict[str, Any] = {"nvjpeg": nvjpeg_available(device), "nvdec": device.type == "cuda" and nvdec_available(),
                           "cpu_workers": workers}
    # images: a batch's JPEG bytes -> GpuImageDecode, against DataLoader workers running the CPU transform
    lmdb = synthetic_lmdb(workdir / "img", {**sizes, "jpeg": sizes["decode_jpeg"], "images": sizes["decode_images"]})
    n, s = sizes["decode_batch"], sizes["size"]
    raw = PackedDataset(lmdb, decode="bytes")
    batches = [[raw[i][0] for i in range(k, min(k + n, len(raw)))] for k in range(0, len(raw), n)]
    gpu = GpuImageDecode(DecodeRandomResizedCrop(s, seed=0), device=device)
    first = gpu(batches[0])
    cpu, pil = DecodeRandomResizedCrop(s, seed=0), PilRandomResizedCrop(s, seed=0)
    on_cpu = torch.stack([cpu(x) for x in batches[0]])
    reference = torch.stack([pil(x) for x in batches[0]])  # Pillow's, with the same boxes
    diff = (first.cpu().int() - on_cpu.int()).abs().float()
    out["images"] = {
        "jpeg": list(sizes["decode_jpeg"]), "batch": n, "output": s, "on_device": gpu.on_device,
        "vs_cpu_transform": {"mean_abs": float(diff.mean()), "max_abs": float(diff.max())},
        # the mean absolute difference from the Pillow reference: of this decode, of the CPU transform
        "vs_pillow_reference": {"device": float((first.cpu().int() - reference.int()).abs().float().mean()),
                                "cpu_transform": float((on_cpu.int() - reference.int()).abs().float().mean())},
        "device": measured(lambda: sum(len(gpu(b)) for b in batches * sizes["decode_passes"]), device),
        "cpu_path": measured(lambda: _drain(DataLoader(
            PackedDataset(lmdb, decode=DecodeRandomResizedCrop(s, seed=0)), batch_size=n, num_workers=workers),
            lambda b: b[0]), torch.device("cpu")),
    }
    c0 = time.process_time()
    for b in batches:
        gpu(b)
    sync(device)
    out["images"]["host_cpu_ms_per_batch"] = (time.process_time() - c0) / len(batches) * 1e3
    out["images"]["refused_by_the_device"] = gpu.refused
    out["images"]["device_vs_cpu_path"] = out["images"]["device"]["per_s"] / out["images"]["cpu_path"]["per_s"]
    # video: pack-videos of the fixture (copies), TSN-8 and dense-32 clips three ways
    src = workdir / "vid" / "src"
    for k in range(sizes["decode_videos"]):
        (src / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"c{k % 2}" / f"v{k}.mp4").write_bytes(VIDEO_FIXTURE.read_bytes())
    pack = workdir / "vid" / "pack.lmdb"
    pack_videos(src, pack, to="lmdb", workers=0)  # in this process: no fork after CUDA started
    decoder = GpuClipDecode(device=device)
    cases = {"tsn8": dict(clip_len=1, num_clips=8, crop_size=224),
             "dense32": dict(clip_len=32, frame_interval=2, num_clips=1, test_mode=True, crop_size=224)}
    out["video"] = {"videos": sizes["decode_videos"], "nvdec": decoder.nvdec}
    for name, kw in cases.items():
        on_cpu = PackedVideoDataset(pack, seed=1, **kw)
        on_gpu = PackedVideoDataset(pack, seed=1, decode_on="gpu", **kw)
        # correctness on this data: the CPU path's clip, frame for frame, without the crop's resize
        plain = {k: v for k, v in kw.items() if k != "crop_size"}
        want, got = PackedVideoDataset(pack, seed=1, **plain)[0][0], decoder(
            [PackedVideoDataset(pack, seed=1, decode_on="gpu", **plain)[0][0]])[0].cpu()
        d = (got.int() - want.int()).abs()
        clips = list(range(len(on_cpu))) * sizes["decode_repeats"]
        bs = sizes["clip_batch"]
        out["video"][name] = {
            "vs_cpu_path": {"max_abs": int(d.max()), "mean_abs": float(d.float().mean()),
                            "same_shape": list(got.shape) == list(want.shape)},
            "clips": len(clips),
            "device": measured(lambda: _drain(DataLoader(Subset(on_gpu, clips), batch_size=bs, num_workers=min(8, workers),
                                                         collate_fn=collate_clips), lambda b: decoder(b[0])), device),
            "cpu_path": measured(lambda: _drain(DataLoader(Subset(on_cpu, clips), batch_size=bs, num_workers=workers),
                                                lambda b: b[0]), torch.device("cpu")),
            "source_video": measured(lambda: _drain(DataLoader(
                SourceClips([str(p) for p in sorted(src.rglob("*.mp4"))], on_cpu, clips), batch_size=bs,
                num_workers=workers), lambda b: b), torch.device("cpu")),
        }
        v = out["video"][name]
        v["device_vs_cpu_path"] = v["device"]["per_s"] / v["cpu_path"]["per_s"]
        v["device_vs_source_video"] = v["device"]["per_s"] / v["source_video"]["per_s"]
    out["video"]["fallbacks_to_cpu"] = decoder.fallbacks
    out["dali"] = ("not measured: DALI is not on the device machines, and installed it takes 788 MB, over the "
                   "64 MiB a device call carries")
    return out


class SourceClips(torch.utils.data.Dataset):
    """The same clips decoded from the source MP4s as mmaction2's ``PyAVDecode`` does: every frame
    from the start up to the last one needed, the wanted ones kept (the decode a pack avoids)."""

    def __init__(self, paths: list[str], dataset: Any, clips: list[int]):
        self.paths, self.dataset, self.clips = paths, dataset, clips

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, k: int) -> int:
        import av

        i = self.clips[k]
        want = set(int(f) for f in self.dataset.clip_indices(i))
        kept = 0
        with av.open(self.paths[i % len(self.paths)]) as c:
            for n, frame in enumerate(c.decode(video=0)):
                if n in want:
                    frame.to_ndarray(format="rgb24")
                    kept += 1
                if n >= max(want):
                    break
        return kept


# -- test results ----------------------------------------------------------------------------------
def test_summary(paths: list[Path], cuda: bool) -> dict:
    """Counts from pytest's junit XML files, the failures by name, and how many CUDA tests passed
    (those named for CUDA, on a machine with CUDA: without it they skip or test its absence)."""
    out: dict[str, Any] = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
                           "cuda_passed": 0, "failures": [], "skip_reasons": {}, "files": [str(p) for p in paths]}
    for path in paths:
        if not path.is_file():
            out.setdefault("missing", []).append(str(path))
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            cuda_named = "cuda" in (case.get("name") or "").lower()
            out["tests"] += 1
            skipped = case.find("skipped")
            if skipped is not None:
                out["skipped"] += 1
                reason = skipped.get("message") or "?"
                out["skip_reasons"][reason] = out["skip_reasons"].get(reason, 0) + 1
            elif case.find("failure") is not None or case.find("error") is not None:
                out["failed" if case.find("failure") is not None else "errors"] += 1
                out["failures"].append(name)
            else:
                out["passed"] += 1
                out["cuda_passed"] += cuda and cuda_named
    return out


# -- main --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for report.json")
    ap.add_argument("--junit", action="append", default=[], type=Path, help="pytest junit XML (repeatable)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: CUDA when available)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device) if args.device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    cuda = device.type == "cuda"
    sizes = GPU_SIZES if cuda else CPU_SIZES
    if sizes["threads"]:
        torch.set_num_threads(sizes["threads"])
    report: dict[str, Any] = {
        "device": str(device), "cuda": cuda,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__, "cuda_version": torch.version.cuda, "cpu_count": os.cpu_count(),
        "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in sizes.items()},
        "tests": test_summary(args.junit, cuda),
    }
    if not cuda:
        report["note"] = ("no CUDA: the same steps ran on the CPU fallback with small sizes; "
                          "the targets are GPU targets and are not judged here")
    path = args.out / "report.json"
    start = time.perf_counter()

    def save() -> None:
        report["elapsed_s"] = round(time.perf_counter() - start, 2)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(path)

    save()
    with tempfile.TemporaryDirectory(prefix="device_check-") as tmp:
        steps: list[tuple[str, Callable[[], dict]]] = [
            ("host_cost", lambda: host_cost(device, sizes)),
            ("normalize", lambda: normalize_throughput(device, sizes)),
            ("h2d", lambda: h2d(device, sizes)),
            ("step_loop", lambda: step_loop(device, sizes, Path(tmp))),
            ("gpu_decode", lambda: gpu_decode(device, sizes, Path(tmp))),
        ]
        for name, fn in steps:
            print(f"device_check: {name} ...", flush=True)
            t0 = time.perf_counter()
            try:
                report[name] = fn()
                report[name]["seconds"] = round(time.perf_counter() - t0, 2)
            except Exception as e:  # noqa: BLE001 - recorded; the other steps still run
                report[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            save()
    report["targets"] = {"host_cost": report["host_cost"].get("met"), "normalize": report["normalize"].get("met"),
                         "wait": report["step_loop"].get("met"),
                         "wait_in_memory": report["step_loop"].get("in_memory", {}).get("met")}
    save()
    print(summary(report))
    failed = any("error" in report[k] for k, _ in steps)
    return 1 if failed else 0


def summary(r: dict) -> str:
    """A few lines for the log: where it ran, the tests, each target."""
    t = r["tests"]
    lines = [f"device_check on {r['device']} ({r['device_name']}), torch {r['torch']}",
             f"tests: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, {t['skipped']} skipped "
             f"({t['cuda_passed']} CUDA tests passed)"]
    lines += [f"  skipped {n}: {why}" for why, n in t["skip_reasons"].items()]
    lines += [f"  FAILED {name}" for name in t["failures"]]
    for name in ("host_cost", "normalize", "h2d", "step_loop", "gpu_decode"):
        v = r.get(name, {})
        if "error" in v:
            lines.append(f"{name}: ERROR {v['error']}")
    hc, nz, hd, sl = (r.get(k, {}) for k in ("host_cost", "normalize", "h2d", "step_loop"))
    if "ratio" in hc:
        lines.append(f"host cost: {hc['ratio']:.2f}x CPU normalization ({hc['cpu_normalize_ms']:.3g} ms) "
                     f"[target {hc['target']}: {hc['met']}]")
    if "speedup" in nz:
        lines.append(f"normalize: {nz['device_images_per_s']:.0f} vs {nz['cpu_images_per_s']:.0f} images/s "
                     f"= {nz['speedup']:.1f}x [target {nz['target']}: {nz['met']}]")
    if "ratio" in hd:
        lines.append(f"h2d: prefetcher {hd['prefetcher_gb_s']:.2f} GB/s vs plain pinned copy "
                     f"{hd['plain_pinned_copy_gb_s']:.2f} GB/s")
    if "loader" in sl:
        lines.append(f"step loop: model {sl['model_alone_ms_per_step']:.1f} ms/step, loader "
                     f"{sl['loader_alone_ms_per_batch']:.1f} ms/batch; the device waits {sl['loader']['wait_fraction']:.1%} "
                     f"(in memory {sl['in_memory']['wait_fraction']:.1%}); bottleneck: {sl['bottleneck']} "
                     f"[target: {sl['met']}]")
    gd = r.get("gpu_decode", {})
    if "images" in gd:
        im = gd["images"]
        lines.append(f"images (nvJPEG {gd['nvjpeg']}): {im['device']['per_s']:.0f}/s on the device vs "
                     f"{im['cpu_path']['per_s']:.0f}/s on {gd['cpu_workers']} CPU workers = {im['device_vs_cpu_path']:.2f}x; "
                     f"host {im['host_cpu_ms_per_batch']:.1f} ms/batch; mean difference from Pillow's "
                     f"{im['vs_pillow_reference']['device']:.2f} (the CPU transform's "
                     f"{im['vs_pillow_reference']['cpu_transform']:.2f})")
    for name in ("tsn8", "dense32"):
        v = gd.get("video", {}).get(name)
        if v:
            lines.append(f"{name} (NVDEC {gd['video']['nvdec']}): {v['device']['per_s']:.1f} clips/s vs CPU path "
                         f"{v['cpu_path']['per_s']:.1f} ({v['device_vs_cpu_path']:.2f}x), source videos "
                         f"{v['source_video']['per_s']:.1f} ({v['device_vs_source_video']:.2f}x); max diff "
                         f"{v['vs_cpu_path']['max_abs']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
