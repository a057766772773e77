"""This checkout against another (``--base-tree``): the commands' and readers' CPU per sample.

Did a change slow anything down? Every row runs ``packer`` as a user runs it, in a fresh
interpreter started in each checkout (``python -m packer ...``, or a small reading script), on
the same generated inputs, rounds interleaved and each round in a new order, a row's two
checkouts back to back, so load from other users of a shared machine hits both checkouts alike.
Each command runs on the whole input and on a tenth of it; the difference of the two CPU times
(``os.wait4``: the process and its workers) over the difference of the inputs is its CPU per
sample with start-up cancelled. Medians over the rounds; a ratio above 1 means this checkout
spends more.

    git worktree add ../base <commit>
    python -m scripts.bench.baseline --base-tree ../base               # ~10 min on 2 cores
    python -m scripts.bench.baseline --base-tree . --quick             # smoke run

Target: no row above 1.03x (issue 40: no throughput figure drops by more than 3% per CPU-second).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from scripts.bench.common import (REPO, _run_interpreter, image_folder, machine_info, md_table, target,
                                  write_result, write_video_folder)

_LOADER = ("import sys, torch, packer\n"
           "from packer.data import {cls}, uint8_collate\n"
           "ds = packer.PackedDataset(sys.argv[1], decode={cls}({args}))\n"
           "n = int(sys.argv[2])\n"
           "dl = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, range(n)), batch_size=64,\n"
           "                                 collate_fn=uint8_collate)\n"
           "print(sum(len(y) for _, y in dl))\n")
READ = _LOADER.format(cls="DecodeResizeCrop", args="256, 224")
TRAIN = _LOADER.format(cls="DecodeRandomResizedCrop", args="224, seed=0")
STREAM = ("import sys, itertools, packer\n"
          "ds = packer.StreamingDataset(sys.argv[1], decode='bytes')\n"
          "print(sum(1 for _ in itertools.islice(ds, int(sys.argv[2]))))\n")

# name -> (kind, input, argv after SRC OUT, output suffix)
ROWS = {
    "to-lmdb --check header": ("pack", "images", ["to-lmdb", "--check", "header"], ".lmdb"),
    "to-records --check header": ("pack", "images", ["to-records", "--check", "header"], ".records"),
    "to-hdf5 --check header": ("pack", "images", ["to-hdf5", "--check", "header"], ".h5"),
    "to-lmdb --check full --workers 2": ("pack", "images", ["to-lmdb", "--workers", "2"], ".lmdb"),
    "decode-frames --short-side 128": ("pack", "videos", ["decode-frames", "--short-side", "128", "--workers", "0"],
                                       ".frames"),
    "pack-videos --short-side 128": ("pack", "videos", ["pack-videos", "--short-side", "128", "--workers", "0"],
                                     ".vrec"),
    "PackedDataset + DataLoader(num_workers=0)": ("read", "lmdb", [], ""),
    "PackedDataset + DecodeRandomResizedCrop + DataLoader(num_workers=0)": ("train", "lmdb", [], ""),
    "StreamingDataset(decode='bytes')": ("stream", "lmdb", [], ""),
}


def _subset(src: Path, dest: Path, keep: int) -> Path:
    """``dest``: a class-folder tree of ``src``'s first ``keep`` files (hard links), made once."""
    if not dest.exists():
        files = sorted(p for p in src.rglob("*") if p.is_file())[:keep]
        for f in files:
            target_path = dest / f.relative_to(src)
            target_path.parent.mkdir(parents=True, exist_ok=True)
            os.link(f, target_path)
    return dest


def _copies(src: Path, dest: Path, k: int) -> Path:
    """``dest``: ``k`` hard-linked copies of the tree ``src`` under other names (more samples
    to pack without generating more images), made once."""
    if not dest.exists():
        for f in sorted(p for p in src.rglob("*") if p.is_file()):
            rel = f.relative_to(src)
            for i in range(k):
                target_path = dest / rel.parent / f"{i}_{rel.name}"
                target_path.parent.mkdir(parents=True, exist_ok=True)
                os.link(f, target_path)
    return dest


def _row(tree: Path, name: str, inputs: dict[str, Path], n: int, out: Path) -> float:
    """CPU seconds of one fresh process of ``tree`` running row ``name`` on ``n`` inputs."""
    kind, source, argv, suffix = ROWS[name]
    for leftover in out.parent.glob(out.name + "*"):
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    env = {"PYTHONPATH": str(tree)}
    if kind == "pack":
        src = inputs[f"{source}-{n}"]
        cmd = [sys.executable, "-m", "packer", argv[0], str(src), str(out) + suffix, *argv[1:]]
    else:
        cmd = [sys.executable, "-c", {"read": READ, "train": TRAIN, "stream": STREAM}[kind], str(inputs["lmdb"]), str(n)]
    text, code, usage = _run_interpreter(cmd, cwd=tree, env=env, timeout=1800)
    if code != 0:
        raise RuntimeError(f"{name} in {tree}: exit {code}")
    return usage["user_s"] + usage["sys_s"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-tree", type=Path, required=True, help="the checkout to compare this one with")
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names (default: all)")
    ap.add_argument("--images", type=int, default=20000, help="images (hard-linked copies of a fifth of them)")
    ap.add_argument("--videos", type=int, default=8, help="videos per class (2 classes, 60 frames each)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one round: proves it runs")
    ap.add_argument("--workdir", type=Path, default=Path("bench-out/baseline"))
    ap.add_argument("--results", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.images, args.videos, args.rounds = 50, 1, 1
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}; choose from {list(ROWS)}")
    trees = {"base": args.base_tree.resolve(), "this": REPO}
    work = args.workdir.resolve()
    machine = machine_info()
    images = _copies(image_folder(work / f"images-{args.images // 5}", count=max(1, args.images // 5), size=(375, 500)),
                     work / f"images-{args.images}", 5)
    videos = work / f"videos-{args.videos}"
    if not videos.exists():
        write_video_folder(videos, per_class=args.videos, classes=2, frames=60, size=(240, 320))
    small_images, small_videos = max(1, args.images // 10), max(1, args.videos * 2 // 4)
    inputs = {f"images-{args.images}": images, f"videos-{args.videos * 2}": videos,
              f"images-{small_images}": _subset(images, work / f"images-{args.images}-{small_images}", small_images),
              f"videos-{small_videos}": _subset(videos, work / f"videos-{args.videos}-{small_videos}", small_videos),
              "lmdb": work / f"images-{args.images}.lmdb"}
    if not inputs["lmdb"].exists():
        _run_interpreter([sys.executable, "-m", "packer", "to-lmdb", str(images), str(inputs["lmdb"])],
                         cwd=REPO, env={}, timeout=1800)
    sizes = {"images": (args.images, small_images), "videos": (args.videos * 2, small_videos),
             "lmdb": (args.images, small_images)}
    per_sample: dict[str, dict[str, list[float]]] = {r: {t: [] for t in trees} for r in rows}
    rng = random.Random(0)
    for rnd in range(args.rounds):
        # rows in a new order each round, a row's two checkouts one right after the other (in a
        # random order): a shared machine's speed drifts over a round, and the pair sees the same
        order = [(r, t) for r in rng.sample(rows, len(rows)) for t in rng.sample(list(trees), len(trees))]
        for r, t in order:
            big, small = sizes[ROWS[r][1]]
            out = work / "out" / f"{t}-{r.split()[0]}"
            out.parent.mkdir(parents=True, exist_ok=True)
            cpu_big = _row(trees[t], r, inputs, big, out)
            cpu_small = _row(trees[t], r, inputs, small, out)
            per_sample[r][t].append(1e3 * (cpu_big - cpu_small) / (big - small))
        print(f"round {rnd + 1}/{args.rounds} done (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    table, targets = [], []
    for r in rows:
        base, this = (statistics.median(per_sample[r][t]) for t in trees)
        # each round's ratio of the two (they ran minutes apart at most), then their median
        paired = [b and t / b for b, t in zip(per_sample[r]["base"], per_sample[r]["this"]) if b > 0]
        ratio = statistics.median(paired) if paired else None
        table.append([r, f"{base:.3f}", f"{this:.3f}", f"{ratio:.3f}" if ratio else "-"])
        targets.append(target(f"{r}: CPU per sample, this checkout / base", ratio, 1.03, at_most=True))
    md = "\n\n".join([
        f"CPU ms per sample (image or video), start-up cancelled ({args.images} vs {small_images} images, "
        f"{args.videos * 2} vs {small_videos} videos); fresh processes; median of {args.rounds} interleaved "
        f"rounds. base: `{trees['base']}`.",
        md_table(["row", "base ms/sample", "this ms/sample", "this / base (median of rounds)"], table),
        md_table(["target", "measured", "goal", ""],
                 [[t["name"], f"{t['value']:.3f}x" if t["value"] else "-", "<= 1.03x",
                   "met" if t["met"] else "missed" if t["met"] is False else ""] for t in targets])])
    print(md)
    write_result("baseline", {"quick": args.quick, "sections": {"baseline": {
        "params": {"base_tree": str(trees["base"]), "images": args.images, "videos": args.videos * 2,
                   "rounds": args.rounds}, "results": per_sample, "targets": targets, "markdown": md}}},
        results=args.results, machine=machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
