"""COCO at scale (issue 41): memory of a COCO pack against pycocotools, a field pack's speed
against an image-only pack of the same images, and detection samples read from a pack against
the source files with pycocotools. Every row is a FRESH process (``run_fresh``).

* ``rss``: a synthetic COCO-sized instances file (``packer.synth.write_coco``: 100,000 64x64
  JPEGs, 700,000 annotations, 305 MB) loaded by ``pycocotools.coco.COCO(file)``, against
  ``packer.pack(IMAGES, OUT, coco=file)`` packing all of it (images included), with its
  default plan (2 cores: 2 forked workers, shared memory) and with ``workers=0``. Peak RSS of
  the process (``VmHWM``) and, with workers, of the process tree: its resident memory sampled
  every 50 ms, summed as PSS (a page shared by n processes counts 1/n in each) and as RSS (shared
  pages counted in every process: an upper bound).
* ``write``: per image size, ``packer.pack`` of the images alone (an ImageFolder of the same
  files) against ``packer.pack(..., coco=file)``, default settings, ``--repeats`` fresh
  processes each, interleaved: samples/s of the run (what the progress bar shows: the listing
  and the annotation file's parse are not in it), CPU-seconds per sample of the run (the
  process and its workers, from ``getrusage``), and of the listing alone (parse included); and
  in one process, the per-sample CPU of the image-only work, the field work and pycocotools
  drawing the image's polygons (which a reader does when it returns masks drawn).
* ``read``: one detection sample (image, boxes, labels, decoded masks) read and decoded from
  an LMDB COCO pack (``PackedDataset(decode="numpy", masks="decode")``) against the source
  files with pycocotools (``COCO`` index, Pillow or OpenCV decode, ``annToMask`` per
  annotation), CPU per sample of the timed loop; building the ``COCO`` index is reported apart.

    python -m scripts.bench.coco all            # ~15 min on 2 cores (generates ~0.5 GB once)
    python -m scripts.bench.coco --quick all    # smoke run, about a minute
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from scripts.bench.common import REPO, descendants, md_table, run_fresh, run_sections, target

MODULE = "scripts.bench.coco"
WORK = REPO / "bench-out" / "coco"


# -- data -------------------------------------------------------------------------------------------
def dataset(work: Path, images: int, annotations: int, size: tuple[int, int]) -> Path:
    """``work/<name>/`` with the images and ``instances.json`` (``packer.synth.write_coco``),
    made once and reused while the spec is unchanged; returns the folder."""
    from packer.synth import write_coco

    root = work / f"{images}x{size[0]}x{size[1]}"
    spec = {"images": images, "annotations": annotations, "size": list(size), "seed": 0}
    marker = root / "spec.json"
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return root
    shutil.rmtree(root, ignore_errors=True)
    t = time.perf_counter()
    write_coco(root, images=images, annotations=annotations, size=size, seed=0,
               distinct=64 if size[0] * size[1] > 100_000 else 256)
    marker.write_text(json.dumps(spec))
    print(f"generated {images} images and {annotations} annotations in {time.perf_counter() - t:.0f} s -> {root}",
          file=sys.stderr)
    return root


def _size(text: str) -> tuple[int, int]:
    h, w = (int(v) for v in text.lower().split("x"))
    return h, w


# -- the rows (each in its fresh process) -----------------------------------------------------------
class TreeMemory:
    """Samples this process and its descendants every ``every`` s: the peak of their summed
    PSS and RSS, and each one's ``VmHWM`` as last seen (Linux ``/proc``)."""

    def __init__(self, every: float = 0.05):
        self.every, self.peak_pss, self.peak_rss = every, 0, 0
        self.hwm: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def _sample(self) -> None:
        pss = rss = 0
        for pid in [os.getpid(), *descendants(os.getpid())]:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            kib = {}
            for line in (status + rollup).splitlines():
                name, _, value = line.partition(":")
                if name in ("VmRSS", "VmHWM", "Pss"):
                    kib[name] = int(value.split()[0])
            rss += kib.get("VmRSS", 0) * 1024
            pss += kib.get("Pss", 0) * 1024
            self.hwm[pid] = kib.get("VmHWM", 0) * 1024
        self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def row_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """``pycocotools`` (``COCO(file)``) or ``packer`` (the whole pack) with memory sampled."""
    t = time.perf_counter()
    with TreeMemory() as tree:
        if spec["what"] == "pycocotools":
            from pycocotools.coco import COCO

            index = COCO(spec["file"])
            count = len(index.imgs)
        else:
            import packer

            count = packer.pack(spec["root"], spec["out"], coco=spec["file"], workers=spec["workers"]).count
    return {"count": count, "seconds": time.perf_counter() - t, "hwm": _hwm(), "tree_pss": tree.peak_pss,
            "tree_rss": tree.peak_rss, "tree_hwm_sum": sum(tree.hwm.values()), "processes": len(tree.hwm)}


def row_write(spec: dict[str, Any]) -> dict[str, Any]:
    """One pack (``coco`` or the images alone), or the COCO listing alone: wall and CPU of the
    run loop (``runner.run`` until every worker is reaped) and of the whole call."""
    import packer
    from packer.commands import pack_fields, pack_images

    if spec["what"] == "listing":
        from packer.conversion.coco import coco_items

        c0, t0 = _cpu(), time.perf_counter()
        n = len(coco_items(spec["file"], spec["root"]).items)
        return {"count": n, "cpu_s": _cpu() - c0, "wall_s": time.perf_counter() - t0}
    start: dict[str, float] = {}
    module = pack_fields if spec["what"] == "coco" else pack_images
    real_run = module.run

    def timed_run(*args: Any, **kwargs: Any) -> Any:  # the run loop starts: the listing is done
        start.update(cpu=_cpu(), wall=time.perf_counter())
        return real_run(*args, **kwargs)

    module.run = timed_run
    c0, t0 = _cpu(), time.perf_counter()
    if spec["what"] == "coco":
        report = packer.pack(spec["root"], spec["out"], coco=spec["file"])
    else:
        report = packer.pack(Path(spec["root"]) / "images", spec["out"])
    c1, t1 = _cpu(), time.perf_counter()
    return {"count": report.count, "run_rate": report.count / report.elapsed, "run_cpu_s": c1 - start["cpu"],
            "run_wall_s": t1 - start["wall"], "call_cpu_s": c1 - c0, "call_wall_s": t1 - t0}


def row_parts(spec: dict[str, Any]) -> dict[str, Any]:
    """Where a field pack's per-sample CPU goes, in this process (no workers): the image-only
    work (read and check), the field work (that, the annotations' fields and the blob) and
    pycocotools drawing the image's polygons alone; the least of ``rounds`` interleaved rounds."""
    from pycocotools import mask

    from packer.commands.pack_fields import FieldJob
    from packer.commands.pack_images import ImageJob
    from packer.conversion.coco import coco_items, decode_annotations

    got = coco_items(spec["file"], spec["root"])
    items = got.items[:spec["count"]]
    h, w = items[0].values["orig_size"]
    polys = []
    for item in items:
        ann = decode_annotations(item.values["annotations"])
        polys.append([p for i in range(len(ann)) for p in (lambda s: s[1] if s[0] == "poly" else [])(ann.segmentation(i))])
    work = {"image job": ImageJob(check="full"), "field job": FieldJob(schema=got.schema, root=spec["root"], coco=True),
            "pycocotools polygon drawing": lambda k: mask.frPyObjects(polys[k], h, w) if polys[k] else None}
    best = {name: float("inf") for name in work}
    for _ in range(spec["rounds"]):
        for name, fn in work.items():
            t = time.process_time()
            for k, item in enumerate(items):
                fn(k if name.startswith("pycocotools") else item)
            best[name] = min(best[name], (time.process_time() - t) / len(items))
    return {"count": len(items), "cpu_s": best}


def row_read(spec: dict[str, Any]) -> dict[str, Any]:
    """Read and decode ``spec["count"]`` detection samples: ``packer`` (a pack) or ``pycocotools``
    over the source files (``decoder`` pil or opencv); CPU of the timed loop per sample."""
    import numpy as np

    n = spec["count"]
    c0 = _cpu()
    if spec["what"] == "packer":
        import packer

        ds = packer.PackedDataset(spec["out"], decode="numpy", masks="decode")

        def sample(i: int) -> Any:
            s = ds[i]
            return s["image"], s["boxes"], s["labels"], s["masks"]
    else:
        from pycocotools.coco import COCO

        coco = COCO(spec["file"])
        cats = sorted(coco.getCatIds())
        label = {c: k for k, c in enumerate(cats)}
        ids = sorted(coco.imgs)[:n]
        if spec["decoder"] == "opencv":
            import cv2

            cv2.setNumThreads(1)

            def image(path: str) -> Any:
                return cv2.cvtColor(cv2.imread(path, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        else:
            from PIL import Image

            def image(path: str) -> Any:
                with Image.open(path) as im:
                    return np.asarray(im.convert("RGB"))

        def sample(i: int) -> Any:
            info = coco.imgs[ids[i]]
            pixels = image(os.path.join(spec["root"], info["file_name"]))
            anns = coco.loadAnns(coco.getAnnIds(imgIds=ids[i]))
            xywh = np.array([a["bbox"] for a in anns], dtype=np.float32).reshape(-1, 4)
            boxes = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
            labels = np.array([label[a["category_id"]] for a in anns], dtype=np.int64)
            masks = (np.stack([coco.annToMask(a) for a in anns]) if anns
                     else np.zeros((0, info["height"], info["width"]), np.uint8))
            return pixels, boxes, labels, masks
    setup = _cpu() - c0
    sample(0)  # one warm-up: library loading is set-up
    c1, t1 = _cpu(), time.perf_counter()
    boxes = 0
    for i in range(n):
        boxes += len(sample(i)[1])
    return {"count": n, "boxes": boxes, "setup_cpu_s": setup, "cpu_s": _cpu() - c1,
            "wall_s": time.perf_counter() - t1}


ROWS = {"memory": row_memory, "write": row_write, "parts": row_parts, "read": row_read}


def _fresh(kind: str, spec: dict[str, Any], timeout: float = 3000) -> dict[str, Any]:
    r = run_fresh(MODULE, {"row": kind, **spec}, timeout=timeout)
    if "error" in r:
        raise RuntimeError(f"{kind} row {spec} failed: {r['error']}")
    return r


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


# -- sections ---------------------------------------------------------------------------------------
def rss_main(argv: list[str]) -> dict[str, Any]:
    """Peak memory: pycocotools' COCO(file) against packer's whole COCO pack of the same file."""
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE} rss")
    ap.add_argument("--images", type=int, default=100_000)
    ap.add_argument("--annotations", type=int, default=700_000)
    ap.add_argument("--size", type=_size, default=(64, 64), help="HxW of the images (default 64x64)")
    ap.add_argument("--workdir", type=Path, default=WORK)
    args = ap.parse_args(argv)
    root = dataset(args.workdir, args.images, args.annotations, args.size)
    file = root / "instances.json"
    out = args.workdir / "rss-out.lmdb"
    rows = {}
    for name, spec in (("pycocotools COCO(file)", {"what": "pycocotools"}),
                       ("packer.pack(coco=file), default (2 workers)", {"what": "packer", "workers": None}),
                       ("packer.pack(coco=file), workers=0", {"what": "packer", "workers": 0})):
        shutil.rmtree(out, ignore_errors=True)
        rows[name] = _fresh("memory", {**spec, "root": str(root), "file": str(file), "out": str(out)})
    shutil.rmtree(out, ignore_errors=True)
    coco = rows["pycocotools COCO(file)"]["hwm"]
    print(f"{args.images:,} images ({args.size[0]}x{args.size[1]} JPEGs), {args.annotations:,} annotations, "
          f"{file.stat().st_size / 1e6:.0f} MB annotation file; each row a fresh process; GB = 1e9 bytes\n")
    table = []
    for name, r in rows.items():
        tree = "" if r["processes"] == 1 else f"{_gb(r['tree_pss'])} / {_gb(r['tree_rss'])}"
        table.append([name, f"{r['count']:,}", f"{r['seconds']:.0f}", _gb(r["hwm"]), f"{r['hwm'] / coco:.2f}", tree,
                      "" if r["processes"] == 1 else f"{r['tree_pss'] / coco:.2f}"])
    print(md_table(["row", "images", "wall s", "peak RSS GB (VmHWM)", "vs pycocotools",
                    "tree peak PSS / RSS GB (sampled)", "tree PSS vs pycocotools"], table))
    print("\nThe pack's rows include packing the images. VmHWM is the process's own peak; with workers, "
          "the tree's is sampled every 50 ms (PSS: shared pages split between the processes sharing them; "
          "RSS: counted in each, an upper bound).")
    default = rows["packer.pack(coco=file), default (2 workers)"]
    alone = rows["packer.pack(coco=file), workers=0"]
    return {"rows": rows, "targets": [
        target("COCO pack peak RSS (workers=0, VmHWM) vs pycocotools COCO(file)", alone["hwm"] / coco, 0.5,
               at_most=True),
        target("COCO pack peak tree PSS (default plan) vs pycocotools COCO(file)", default["tree_pss"] / coco, 0.5,
               at_most=True)]}


def write_main(argv: list[str]) -> dict[str, Any]:
    """A field pack's samples/s and CPU per sample against the same images packed alone."""
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE} write")
    ap.add_argument("--configs", default="64x64:4000,480x640:1000",
                    help="HxW:images, comma-separated (7 annotations an image)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=WORK)
    args = ap.parse_args(argv)
    figures: dict[str, Any] = {"configs": {}, "targets": []}
    for config in args.configs.split(","):
        size, count = _size(config.split(":")[0]), int(config.split(":")[1])
        root = dataset(args.workdir, count, 7 * count, size)
        base = {"root": str(root), "file": str(root / "instances.json"), "out": str(args.workdir / "write-out.lmdb")}
        runs: dict[str, list[dict[str, Any]]] = {"images": [], "coco": [], "listing": []}
        for _ in range(args.repeats):
            for what in runs:
                shutil.rmtree(base["out"], ignore_errors=True)
                runs[what].append(_fresh("write", {**base, "what": what}))
        shutil.rmtree(base["out"], ignore_errors=True)
        n = runs["images"][0]["count"]

        def best(what: str, key: str, per: bool = True) -> tuple[float, float, float]:
            vals = [r[key] / (r["count"] if per else 1) for r in runs[what]]
            return min(vals), max(vals), sorted(vals)[len(vals) // 2]

        rate_i, rate_c = best("images", "run_rate", False), best("coco", "run_rate", False)
        cpu_i, cpu_c = best("images", "run_cpu_s"), best("coco", "run_cpu_s")
        call_i, call_c = best("images", "call_wall_s", False), best("coco", "call_wall_s", False)
        listing = best("listing", "cpu_s")
        print(f"\n{n:,} images {size[0]}x{size[1]}, {7 * n:,} annotations; default settings (2 cores: shared-memory "
              f"workers); {args.repeats} fresh processes per row, interleaved; median (min-max)\n")
        rows = [["images alone: packer.pack(images)", f"{rate_i[2]:.0f} ({rate_i[0]:.0f}-{rate_i[1]:.0f})",
                 f"{cpu_i[2] * 1e6:.0f} ({cpu_i[0] * 1e6:.0f}-{cpu_i[1] * 1e6:.0f})", f"{call_i[2]:.1f}"],
                ["COCO field pack: packer.pack(coco=...)", f"{rate_c[2]:.0f} ({rate_c[0]:.0f}-{rate_c[1]:.0f})",
                 f"{cpu_c[2] * 1e6:.0f} ({cpu_c[0] * 1e6:.0f}-{cpu_c[1] * 1e6:.0f})", f"{call_c[2]:.1f}"],
                ["field pack / images alone", f"{rate_c[2] / rate_i[2]:.2f}", f"{cpu_c[2] / cpu_i[2]:.2f}",
                 f"{call_c[2] / call_i[2]:.2f}"]]
        print(md_table(["row", "run samples/s (wall)", "run CPU µs/sample (all processes)", "whole call wall s"], rows))
        print(f"\nThe COCO listing alone (streaming parse and checks, a fresh process): "
              f"{listing[2] * 1e6:.0f} µs CPU per image ({listing[2] * n:.1f} s), before the run starts.")
        parts = _fresh("parts", {**base, "count": min(n, 1000), "rounds": args.repeats})
        cpu = {k: v * 1e6 for k, v in parts["cpu_s"].items()}
        print(f"\nPer sample in one process (no workers; the least of {args.repeats} interleaved rounds over "
              f"{parts['count']} images): the image-only work {cpu['image job']:.0f} µs CPU, the field work "
              f"{cpu['field job']:.0f} µs; pycocotools drawing the image's polygons (now on read, "
              f"`masks=\"rle\"` or `\"decode\"`: no longer in the field work) {cpu['pycocotools polygon drawing']:.0f} µs.")
        name = f"{size[0]}x{size[1]}"
        figures["configs"][name] = {**runs, "parts": parts}
        figures["targets"] += [
            target(f"COCO field pack vs image-only pack, run samples/s, {name}", rate_c[2] / rate_i[2], 0.9),
            target(f"COCO field pack vs image-only pack, run CPU per sample, {name}", cpu_c[2] / cpu_i[2], 1.1,
                   at_most=True)]
    return figures


def read_main(argv: list[str]) -> dict[str, Any]:
    """Detection samples read from an LMDB COCO pack against the source files with pycocotools."""
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE} read")
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--size", type=_size, default=(480, 640), help="HxW of the images (default 480x640)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=WORK)
    args = ap.parse_args(argv)
    root = dataset(args.workdir, args.images, 7 * args.images, args.size)
    out = args.workdir / f"read-{root.name}.lmdb"
    if not (out / "manifest.json").is_file():
        import packer

        shutil.rmtree(out, ignore_errors=True)
        packer.pack(root, out, coco=root / "instances.json")
    base = {"root": str(root), "file": str(root / "instances.json"), "out": str(out), "count": args.images}
    specs = {"packer: PackedDataset(decode='numpy', masks='decode')": {"what": "packer"},
             "pycocotools + Pillow decode": {"what": "pycocotools", "decoder": "pil"},
             "pycocotools + OpenCV decode": {"what": "pycocotools", "decoder": "opencv"}}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in specs}
    for _ in range(args.repeats):
        for name, spec in specs.items():
            runs[name].append(_fresh("read", {**base, **spec}))
    per = {k: sorted(r["cpu_s"] / r["count"] for r in v) for k, v in runs.items()}
    mid = {k: v[len(v) // 2] for k, v in per.items()}
    ref = mid["packer: PackedDataset(decode='numpy', masks='decode')"]
    print(f"\n{args.images:,} images {args.size[0]}x{args.size[1]}, {7 * args.images:,} annotations; image, boxes, "
          f"labels and masks decoded per sample, one process; {args.repeats} fresh processes per row; median (min-max)\n")
    rows = [[k, f"{mid[k] * 1e6:.0f} ({v[0] * 1e6:.0f}-{v[-1] * 1e6:.0f})", f"{1 / mid[k]:.0f}", f"{mid[k] / ref:.2f}",
             f"{min(r['setup_cpu_s'] for r in runs[k]):.2f}"] for k, v in per.items()]
    print(md_table(["row", "CPU µs/sample", "samples per CPU-s", "CPU vs packer", "set-up CPU s (index, open)"],
                   rows))
    return {"runs": runs, "targets": [
        target(f"detection sample read: pycocotools + {d} vs packer, CPU per sample", mid[f"pycocotools + {d} decode"]
               / ref, 1.0) for d in ("Pillow", "OpenCV")]}


def main(argv: list[str] | None = None) -> int:
    """``rss``, ``write``, ``read`` or ``all``; or ``--child SPEC`` (one row, in its fresh process)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        with open(argv[1]) as f:
            spec = json.load(f)
        print(json.dumps(ROWS[spec.pop("row")](spec)))
        return 0
    quick = WORK.parent / "coco-quick"
    return run_sections("coco", __doc__, {"rss": rss_main, "write": write_main, "read": read_main},
                        all_sections=("rss", "write", "read"),
                        quick={"rss": ["--images", "300", "--annotations", "2100", "--workdir", str(quick)],
                               "write": ["--configs", "64x64:200", "--repeats", "1", "--workdir", str(quick)],
                               "read": ["--images", "40", "--size", "60x80", "--repeats", "1",
                                        "--workdir", str(quick)]},
                        notes=["Each row a fresh process; on a shared machine compare CPU per sample and "
                               "the ratios, which come from rows interleaved in one run."], argv=argv)


if __name__ == "__main__":
    sys.exit(main())
