#!/usr/bin/env python
"""Multigrid training demo on CPU: a tiny 3D CNN, with and without the multigrid schedule.

1. Decodes the fixture videos (``tests/fixtures/videos``, or ``--videos DIR``; synthetic
   videos when neither exists) with ``packer``'s ``decode-frames`` into a temp dir, as frame
   folders (``FrameDataset``) or a packed format (``--format lmdb|hdf5``, ``PackedVideoDataset``).
2. Trains two copies of a tiny 3D CNN (``SubBatchNorm3d`` in place of BatchNorm3d) through a
   plain ``DataLoader(dataset, batch_sampler=MultigridBatchSampler(...), num_workers=2)``:
   *plain* at the full shape (both cycles off), *multigrid* visiting each shape of the
   schedule (the four long-cycle shapes of the first learning-rate stage, then the
   fine-tune), with the schedule's learning rate and BatchNorm splits. Plain and multigrid
   iterations alternate step by step, so that load on a shared machine hits both alike.
3. Prints the batch shapes seen, samples/s and seconds per iteration of each block, and the
   speedup of the whole schedule: FLOP-equivalent (``1 / relative_cost()``, a clip costs
   ``T x S^2``), in iterations (``iterations()``), and estimated in wall-clock time from the
   measured seconds per iteration of each shape.

A handful of videos makes too small an epoch for the long cycle's batches of 64 clips, so the
dataset is cycled to ``--epoch-size`` clips (each clip still a fresh random crop and offset).

    python -m scripts.demo.multigrid                    # frame folders, < 1 min on 2 cores
    python -m scripts.demo.multigrid --format lmdb --iters 12
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from packer.commands.decode_frames import FrameOptions
from packer.conversion.options import RunOptions

REPO = Path(__file__).resolve().parents[2]

from packer import FrameDataset, PackedVideoDataset
from packer.data.multigrid import MultigridBatchSampler, MultigridSchedule, SubBatchNorm3d, set_sub_bn_splits
from packer.data.video import split_request
from packer.commands.decode_frames import decode_frames
from packer.formats import FORMATS
from packer.conversion.inputs import DEFAULT_VIDEO_EXTS
from packer.synth import natural_image

FIXTURES = REPO / "tests" / "fixtures" / "videos"
MEAN, STD = 0.45, 0.225  # the usual Kinetics normalisation, one value for all channels


class Cycled(Dataset):
    """``length`` clips cycling over ``dataset``'s videos (``ClipRequest`` keys passed on)."""

    def __init__(self, dataset: Dataset, length: int):
        self.dataset, self.length = dataset, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key):
        req = split_request(key)
        return self.dataset[req._replace(index=req.index % len(self.dataset))]


def make_sources(videos: Path | None, src: Path) -> str:
    """``src/class_{0,1}/`` with links to every video in ``videos`` (or 8 synthetic ones)."""
    files = sorted(p for p in videos.iterdir() if p.suffix.lower().lstrip(".") in DEFAULT_VIDEO_EXTS) \
        if videos is not None and videos.is_dir() else []
    for k, path in enumerate(files):
        (src / f"class_{k % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"class_{k % 2}" / path.name).symlink_to(path.resolve())
    if files:
        return f"{len(files)} videos from {videos}"
    for k in range(8):  # a moving natural-looking picture, 340x256, 64 frames
        (src / f"class_{k % 2}").mkdir(parents=True, exist_ok=True)
        out = cv2.VideoWriter(str(src / f"class_{k % 2}" / f"synthetic_{k}.mp4"),
                              cv2.VideoWriter_fourcc(*"mp4v"), 25, (340, 256))
        base = natural_image(np.random.default_rng(k), 256, 340)
        for t in range(64):
            out.write(np.roll(base, 3 * t, axis=1)[:, :, ::-1].copy())
        out.release()
    return "8 synthetic videos (no fixture videos found)"


def tiny_model(num_classes: int, splits: int) -> nn.Module:
    """Three 3x3x3 conv + SubBatchNorm3d + ReLU blocks, global pooling, a linear head."""
    def block(cin: int, cout: int, stride) -> list[nn.Module]:
        return [nn.Conv3d(cin, cout, 3, stride=stride, padding=1, bias=False), SubBatchNorm3d(cout, splits),
                nn.ReLU(inplace=True)]
    return nn.Sequential(*block(3, 16, (1, 2, 2)), *block(16, 32, 2), *block(32, 64, 2),
                         nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(64, num_classes))


class Run:
    """One model trained under one schedule, block by block."""

    def __init__(self, name: str, schedule: MultigridSchedule, dataset: Dataset, num_classes: int,
                 base_lr: float, workers: int, seed: int):
        torch.manual_seed(seed)
        self.name, self.schedule, self.base_lr = name, schedule, base_lr
        self.sampler = MultigridBatchSampler(len(dataset), schedule, seed=seed, drop_last=True)
        self.loader = DataLoader(dataset, batch_sampler=self.sampler, num_workers=workers,
                                 persistent_workers=workers > 0)
        self.model = tiny_model(num_classes, schedule.at(0)["lr_multiplier"])
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=base_lr, momentum=0.9, weight_decay=1e-4)
        self.splits = schedule.at(0)["lr_multiplier"]

    def start(self, epoch: int, iters: int) -> None:
        """Enter ``epoch``'s stage (shapes, learning rate, BatchNorm splits) and train its first
        batch (workers starting, first short-cycle phase: not timed)."""
        self.sampler.set_epoch(epoch)
        self.epoch, self.stage = epoch, self.schedule.at(epoch)
        if self.stage["lr_multiplier"] != self.splits:  # long cycle moved: BN groups stay at the base size
            self.splits = self.stage["lr_multiplier"]
            set_sub_bn_splits(self.model, self.splits)
        for group in self.optimizer.param_groups:
            group["lr"] = self.base_lr * self.schedule.lr_at(epoch)
        if len(self.sampler) < iters + 1:
            raise SystemExit(f"--epoch-size too small for {iters + 1} batches of epoch {epoch}")
        self.model.train()
        self.batches = iter(self.loader)
        self.seen: dict[tuple[int, ...], None] = {}
        self.samples, self.seconds, self.compute, self.cpu, self.losses = 0, 0.0, 0.0, 0.0, []
        self.step(timed=False)

    def step(self, timed: bool = True) -> None:
        """One training iteration: wait for the next batch, forward, backward, update."""
        t0 = time.perf_counter()
        clips, labels = next(self.batches)
        t1, c1 = time.perf_counter(), time.process_time()
        x = clips.float().div_(255).sub_(MEAN).div_(STD)  # (B, 3, T, S, S)
        loss = nn.functional.cross_entropy(self.model(x), labels)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        t2, c2 = time.perf_counter(), time.process_time()
        if timed:
            self.seen[tuple(clips.shape)] = None
            self.samples += clips.shape[0]
            self.seconds += t2 - t0
            self.compute += t2 - t1
            self.cpu += c2 - c1
            self.losses.append(loss.item())

    def finish(self, iters: int) -> dict[str, Any]:
        """The figures of the block since ``start``."""
        self.batches = None  # drop the iterator: the persistent workers wait for the next one
        return {"run": self.name, "epoch": self.epoch, "stage": self.stage, "shapes": list(self.seen),
                "samples": self.samples, "seconds": self.seconds, "compute": self.compute, "cpu": self.cpu, "iters": iters,
                "loss": float(np.mean(self.losses))}


def shape_key(stage: dict[str, Any]) -> tuple[int, int]:
    return stage["num_frames"], stage["crop_size"]


def report(schedule: MultigridSchedule, plain: MultigridSchedule, blocks: list[dict[str, Any]],
           num_samples: int) -> None:
    """The block table, then the whole-schedule speedups. Each multigrid block is compared with
    the plain block run alongside it (same load): its seconds per iteration over plain's, in
    wall-clock time (data wait included) and in CPU time of the training step (this process;
    the figure that load on a shared machine disturbs least)."""
    print(f"\n{'run':<10}{'epoch':>6}{'T':>4}{'S':>5}  {'batches seen (B x C x T x S x S)':<44}"
          f"{'s/iter':>7}{'cpu/iter':>9}{'clips/s':>8}{'loss':>6}  vs plain: wall  cpu")
    ratios: dict[tuple[int, int], tuple[float, float]] = {}
    for plain_block, mg_block in zip(blocks[::2], blocks[1::2]):
        ratio = mg_block["seconds"] / plain_block["seconds"], mg_block["cpu"] / plain_block["cpu"]
        ratios[shape_key(mg_block["stage"])] = ratio
        for b, text in ((plain_block, ""), (mg_block, f"{ratio[0]:>19.2f}{ratio[1]:>5.2f}")):
            st = b["stage"]
            seen = ", ".join("x".join(map(str, s)) for s in sorted(b["shapes"], key=lambda s: s[-1]))
            print(f"{b['run']:<10}{b['epoch']:>6}{st['num_frames']:>4}{st['crop_size']:>5}  {seen:<44}"
                  f"{b['seconds'] / b['iters']:>7.3f}{b['cpu'] / b['iters']:>9.3f}"
                  f"{b['samples'] / b['seconds']:>8.1f}{b['loss']:>6.2f}{text}")

    mg_iters = schedule.iterations(num_samples, drop_last=True)
    plain_iters = sum(plain.iterations(num_samples, drop_last=True))
    # Whole schedule, in plain iterations: each stage's iterations x its shape's measured ratio.
    wall = sum(n * ratios[shape_key(st)][0] for n, st in zip(mg_iters, schedule.plan))
    cpu = sum(n * ratios[shape_key(st)][1] for n, st in zip(mg_iters, schedule.plan))
    short = MultigridSchedule(schedule.base_batch_size, schedule.num_frames, schedule.crop_size,
                              schedule.base_lr_steps, schedule.max_epoch, long_cycle=False)
    long = MultigridSchedule(schedule.base_batch_size, schedule.num_frames, schedule.crop_size,
                             schedule.base_lr_steps, schedule.max_epoch, short_cycle=False)
    print(f"\nwhole schedule ({schedule.max_epoch} plain epochs -> {schedule.total_epochs} multigrid epochs, "
          f"{num_samples} clips an epoch):")
    print(f"  FLOP-equivalent speedup, 1 / relative_cost(): {1 / schedule.relative_cost():.2f}x "
          f"(short cycle only {1 / short.relative_cost():.2f}x, long cycle only {1 / long.relative_cost():.2f}x)")
    print(f"  iterations: plain {plain_iters}, multigrid {sum(mg_iters)} -> {plain_iters / sum(mg_iters):.2f}x fewer")
    print(f"  measured time per iteration, multigrid / plain (weighted by each shape's iterations): "
          f"wall {wall / sum(mg_iters):.2f}, training-step CPU {cpu / sum(mg_iters):.2f}")
    print(f"  estimated speedup of the whole schedule: wall {plain_iters / wall:.2f}x, "
          f"training-step CPU {plain_iters / cpu:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=Path, default=FIXTURES, help="folder of videos to decode (flat)")
    ap.add_argument("--format", default="frames", choices=["frames", *sorted(FORMATS)],
                    help="decode into frame folders (FrameDataset) or a packed format (PackedVideoDataset)")
    ap.add_argument("--batch", type=int, default=4, help="per-process batch size of the full shape")
    ap.add_argument("--frames", type=int, default=8, help="T of the full shape")
    ap.add_argument("--crop", type=int, default=64, help="S of the full shape")
    ap.add_argument("--sampling-rate", type=int, default=4, help="frame interval of the full shape")
    ap.add_argument("--iters", type=int, default=24, help="timed iterations per block (plus one warm-up)")
    ap.add_argument("--epoch-size", type=int, default=None,
                    help="clips per epoch, the videos cycled (default: enough for every block)")
    ap.add_argument("--num-samples", type=int, default=240_000,
                    help="clips an epoch for the whole-schedule estimate (Kinetics-400: 240k)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the training step (1: the loader workers have the other cores)")
    ap.add_argument("--lr", type=float, default=0.01, help="base learning rate")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="multigrid_demo_"))
    try:
        described = make_sources(args.videos, work / "src")
        out = work / ("packed.h5" if args.format in FORMATS and FORMATS[args.format][0].single_file
                      else args.format)
        rep = decode_frames(work / "src", out, to=args.format,
                            frame_options=FrameOptions(short_side=round(args.crop * 1.25), max_frames=64),
                            run_options=RunOptions(workers=2, max_failures=1_000_000, timeout=600.0))
        print(f"decoded {described}:\n  {rep.summary()}")
        for f in rep.failures:
            print(f"  {f['stage']}: {f['key']}: {f['reason']}")
        kw = dict(clip_len=args.frames, frame_interval=args.sampling_rate, layout="CTHW", crop_size=args.crop)
        videos = FrameDataset(out, **kw) if args.format == "frames" else PackedVideoDataset(out, **kw)
        steps, max_epoch = [0, 94, 154, 196], 239  # SlowFast's Kinetics steps
        common = (args.batch, args.frames, args.crop, steps, max_epoch)
        schedule = MultigridSchedule(*common, sampling_rate=args.sampling_rate)
        plain = MultigridSchedule(*common, long_cycle=False, short_cycle=False, sampling_rate=args.sampling_rate)
        # the timed batches, the warm-up and the batches the workers prefetch, at the largest batch
        largest = max(b for stage in schedule.plan for b, _ in stage["short_cycle"])
        epoch_size = args.epoch_size or largest * (args.iters + 1 + 2 * max(args.workers, 1))
        dataset = Cycled(videos, epoch_size)
        print(f"\nmultigrid schedule ({len(videos)} videos cycled to {epoch_size} clips an epoch; "
              f"{torch.get_num_threads()} torch threads, {args.workers} loader workers):")
        print(schedule.describe())

        runs = {name: Run(name, s, dataset, 2, args.lr, args.workers, args.seed)
                for name, s in (("plain", plain), ("multigrid", schedule))}
        epochs = [p["start_epoch"] for p in schedule.plan[:4]] + [schedule.plan[-1]["start_epoch"]]
        started = time.perf_counter()
        blocks = []
        for k, epoch in enumerate(epochs):  # plain and multigrid steps alternate: same load for both
            runs["plain"].start(k, args.iters)
            runs["multigrid"].start(epoch, args.iters)
            for _ in range(args.iters):
                runs["plain"].step()
                runs["multigrid"].step()
            blocks += [runs["plain"].finish(args.iters), runs["multigrid"].finish(args.iters)]
        report(schedule, plain, blocks, args.num_samples)
        print(f"\n(training blocks took {time.perf_counter() - started:.0f}s; ratios are measured side by side, "
              "absolute figures depend on the machine's load)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
