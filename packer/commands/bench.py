"""``packer bench``: is data loading the bottleneck of training, and which ``num_workers`` to use.

For each ``num_workers`` it runs the real ``DataLoader`` (``PackedDataset`` + the chosen decode
pipeline + ``uint8_collate``) into ``DevicePrefetcher`` and, after one start-up batch, times
``steps`` batches. In the same run it measures the *ceiling*: the same kind of batches served
from memory through the same consumer (prefetcher normalization + the simulated model step of
``model_ms``), i.e. what the training loop could take if loading were free. A setting is
data-bound when the loader gives less than 95% of the ceiling.

JSON fields (``packer bench --json``; also ``JSON_FIELDS`` / ``SETTING_FIELDS``):

* ``path``, ``format``, ``count``: the dataset.
* ``batch_size``, ``steps``, ``decode``, ``resize``, ``crop``, ``model_ms``: what was run.
* ``device``: where batches went (``"cpu"`` or the CUDA device with its name); ``cpu_count``.
* ``sample_bytes``: mean stored (encoded) bytes per sample; MB/s = samples/s x this.
* ``ceiling``: ``{samples_per_s, mb_per_s}`` of in-memory batches through the same consumer.
* ``settings``: one object per ``num_workers``:
  ``num_workers``, ``samples_per_s``, ``mb_per_s``, ``ratio_to_ceiling`` (loader / ceiling),
  ``data_bound`` (ratio < 0.95), ``slowdown`` (ceiling / loader: how much faster training
  would go with free loading, >= 1), ``first_batch_s`` (time to the first batch of an
  epoch), ``worker_startup_s`` (what starting the workers adds per epoch: first batch minus a
  steady batch), ``wait_ms_median`` / ``wait_ms_p95`` (time the loop waited per batch),
  ``verdict`` (one line), and ``against`` (``{samples_per_s, ratio}`` reading the original
  files with ``--against``, ratio = packed / files; else null).
* ``recommended``: ``{num_workers, persistent_workers, prefetch_factor, reasons}``.
* ``cache``: ``{sample_shape, bytes, free_bytes, fits, device}`` for
  ``DevicePrefetcher.cache`` (fits = bytes <= half the free memory, leaving the rest to the
  model); null when samples have no fixed shape.
* ``verdict``: one line for the recommended setting.
* ``threads``: ``packer.Loader`` with 1 and N threads over the same samples:
  ``{threads, one_thread_samples_per_s, samples_per_s, scaling, available, cpus, holds_gil,
  advice}`` (``available``: the scaling GIL-free work got at the same moment; ``holds_gil`` null
  when the machine was too busy to tell)
  (``holds_gil``: N threads give < 1.3x one thread: use the DataLoader); null if not batchable.
* ``mixing``: distinct classes per batch, ``{batch_size, iid, stored: {median, p10, ratio},
  streaming: {...}}`` for the stored order and ``StreamingDataset``'s default order against
  the exact iid expectation (ratio = median / iid); null for one class.
* ``fidelity``: per fast decode path and its torchvision pipeline, median PSNR against a
  full-decode Lanczos reference and the measured shift over ``--fidelity`` samples
  (``packer.commands.fidelity``; rows ``pipeline, kind, images, psnr_median, psnr_p10,
  shift_median, shift_max``); empty with ``--fidelity 0``.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import statistics
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

from packer.errors import PackerError, UsageError

__all__ = ["DECODES", "JSON_FIELDS", "SETTING_FIELDS", "FolderDataset", "make_decode", "run_bench",
           "format_report", "plot_bench", "parse_workers"]

log = logging.getLogger(__name__)

DECODES = ("fast", "pil", "tensor")
DATA_BOUND_BELOW = 0.95
CACHE_FITS_FRACTION = 0.5

JSON_FIELDS = {
    "path": "the dataset path", "format": "its packed format", "count": "samples in it",
    "batch_size": "samples per batch", "steps": "batches timed per setting",
    "decode": "decode pipeline (fast | pil | tensor)", "resize": "short side resized to",
    "crop": "centre crop side", "model_ms": "simulated training step (ms)",
    "device": "where batches went", "cpu_count": "CPUs of this machine",
    "sample_bytes": "mean stored bytes per sample", "ceiling": "{samples_per_s, mb_per_s} from memory",
    "settings": "one object per num_workers", "recommended": "{num_workers, persistent_workers, "
    "prefetch_factor, reasons}", "cache": "{sample_shape, bytes, free_bytes, fits, device} or null",
    "verdict": "one line for the recommended setting",
    "threads": "{threads, one_thread_samples_per_s, samples_per_s, scaling, available, cpus, holds_gil, "
               "advice} or null",
    "mixing": "{batch_size, iid, stored, streaming}: distinct classes per batch vs iid, or null",
    "fidelity": "[{pipeline, kind, images, psnr_median, psnr_p10, shift_median, shift_max}]",
}
SETTING_FIELDS = {
    "num_workers": "DataLoader workers", "samples_per_s": "loader throughput",
    "mb_per_s": "stored MB read per second", "ratio_to_ceiling": "loader / ceiling",
    "data_bound": "ratio_to_ceiling < 0.95", "slowdown": "ceiling / loader (>= 1)",
    "first_batch_s": "time to the first batch of an epoch",
    "worker_startup_s": "start-up cost per epoch", "wait_ms_median": "median wait per batch",
    "wait_ms_p95": "95th percentile wait per batch", "verdict": "one line",
    "against": "{samples_per_s, ratio} over the original files, or null",
}


def parse_workers(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``; UsageError for anything else."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--workers must be comma-separated integers like 0,1,2, not {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise UsageError(f"--workers must list integers >= 0, not {text!r}")
    return sorted(set(values))


def make_decode(decode: str, resize: int, crop: int) -> Any:
    """The decode pipeline behind ``--decode``: a PackedDataset ``decode=`` value."""
    from packer.data.transforms import DecodeResizeCrop, PilResizeCrop

    if decode == "fast":
        return DecodeResizeCrop(resize, crop)
    if decode == "pil":
        return PilResizeCrop(resize, crop)
    if decode == "tensor":
        return "tensor"
    raise UsageError(f"--decode must be one of {', '.join(DECODES)}, not {decode!r}")


class FolderDataset:
    """The original files of an ImageFolder tree, read and decoded like a packed dataset."""

    def __init__(self, root: str | os.PathLike, decode: Any):
        from packer.data.datasets import decode_record
        from packer.conversion.inputs import image_folder

        self.items, self.classes = image_folder(root)
        if not self.items:
            raise UsageError(f"{root}: no images found")
        self.decode = decode
        self._decode_record = decode_record

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        item = self.items[index]
        with open(item.path, "rb") as f:
            data = f.read()
        if callable(self.decode):
            return self.decode(data), item.label
        return self._decode_record(data, self.decode, where=item.path), item.label


def _device_sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(batches: Iterable[Any], *, device: Any, steps: int, batch_size: int, model_ms: float,
             tick: Callable[[], None]) -> dict[str, Any]:
    """Time one epoch of ``batches`` through DevicePrefetcher + a simulated model step."""
    from packer.data.prefetch import DevicePrefetcher

    step_s = model_ms / 1000.0
    t0 = time.perf_counter()
    it = iter(DevicePrefetcher(batches, device=device))
    first = next(it)
    _device_sync(device)
    first_s = time.perf_counter() - t0
    del first
    tick()
    if step_s:
        time.sleep(step_s)
    waits: list[float] = []
    start = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        waits.append(time.perf_counter() - t)
        del batch
        tick()
        if step_s:
            time.sleep(step_s)
    _device_sync(device)
    elapsed = max(time.perf_counter() - start, 1e-9)
    del it
    samples = len(waits) * batch_size
    median = statistics.median(waits) if waits else 0.0
    waits.sort()
    p95 = waits[min(len(waits) - 1, int(0.95 * len(waits)))] if waits else 0.0
    return {"samples_per_s": samples / elapsed, "first_batch_s": first_s,
            "worker_startup_s": max(0.0, first_s - elapsed / max(len(waits), 1)),
            "wait_ms_median": 1000 * median, "wait_ms_p95": 1000 * p95}


class _Replay:
    """``count`` batches replayed from a few held in memory (the ceiling's input)."""

    def __init__(self, batches: Sequence[Any], count: int):
        self.batches, self.count = batches, count

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for i in range(self.count):
            yield self.batches[i % len(self.batches)]


def _loader(dataset: Any, *, num_workers: int, batch_size: int, batches: int, seed: int, pin: bool):
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from packer.data.prefetch import uint8_collate

    sampler = RandomSampler(dataset, num_samples=batches * batch_size,
                            generator=torch.Generator().manual_seed(seed))
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      collate_fn=uint8_collate, pin_memory=pin)


def _sample_bytes(reader: Any, limit: int = 64) -> float:
    n = len(reader)
    idx = range(0, n, max(1, n // limit))
    sizes = [len(reader.read(i).data) for i in idx]
    return sum(sizes) / max(len(sizes), 1)


def _recommend(result: dict[str, Any]) -> dict[str, Any]:
    settings = result["settings"]
    best = max(s["samples_per_s"] for s in settings)
    pick = min((s for s in settings if s["samples_per_s"] >= 0.95 * best), key=lambda s: s["num_workers"])
    w = pick["num_workers"]
    reasons = [f"num_workers={w}: {pick['samples_per_s']:.0f} samples/s, within 5% of the best measured "
               f"({best:.0f})"]
    if pick["data_bound"]:
        more = " (the largest tested; try more if CPUs are free)" if w == max(s["num_workers"] for s in settings) else ""
        cheaper = "pre-resizing (packer resize)" if result["decode"] == "fast" else "--decode fast"
        reasons.append(f"still data-bound: the loop could take {pick['slowdown']:.2f}x more{more}; "
                       f"{cheaper} or the device cache would help")
    persistent = False
    if w > 0:
        epoch_s = result["count"] / max(pick["samples_per_s"], 1e-9)
        frac = pick["worker_startup_s"] / max(epoch_s, 1e-9)
        persistent = frac > 0.01
        reasons.append(f"worker start-up costs {pick['worker_startup_s']:.2f} s per epoch "
                       f"({100 * frac:.1f}% of a {epoch_s:.1f} s epoch): persistent_workers="
                       f"{'True' if persistent else 'False (not worth it)'}")
    prefetch = None
    if w > 0:
        step_ms = 1000 * result["batch_size"] / max(result["ceiling"]["samples_per_s"], 1e-9)
        if pick["data_bound"]:
            prefetch = 2
            reasons.append("prefetch_factor=2 (default): prefetching cannot add throughput when data-bound")
        elif pick["wait_ms_p95"] > 0.1 * step_ms:
            prefetch = 4
            reasons.append(f"prefetch_factor=4: waits spike to {pick['wait_ms_p95']:.1f} ms (p95) against a "
                           f"{step_ms:.1f} ms step; a deeper queue absorbs the jitter")
        else:
            prefetch = 2
            reasons.append("prefetch_factor=2 (default) keeps up: waits stay short")
    cache = result.get("cache")
    if cache and cache["fits"]:
        reasons.append(f"the decoded dataset ({cache['bytes'] / 2**30:.2f} GiB) fits on {cache['device']}: "
                       f"DevicePrefetcher.cache(dataset) serves it with no per-epoch CPU work")
    return {"num_workers": w, "persistent_workers": persistent, "prefetch_factor": prefetch, "reasons": reasons}


def _verdict(s: dict[str, Any], ceiling: float) -> str:
    if s["data_bound"]:
        return (f"data-bound: loader {s['samples_per_s']:.0f} samples/s, the loop takes {ceiling:.0f} "
                f"({s['slowdown']:.2f}x)")
    return f"not data-bound: loader keeps up ({100 * s['ratio_to_ceiling']:.0f}% of the ceiling)"


@dataclass(frozen=True)
class BenchOptions:
    """What ``run_bench`` measures: batches of ``batch_size`` through ``decode`` (with ``resize``
    and ``crop`` for the fast pipelines) for ``steps`` steps per ``workers`` setting, each step
    followed by ``model_ms`` of simulated model time on ``device``; ``seed`` fixes the order;
    ``fidelity`` samples for the fidelity table (0: none)."""

    batch_size: int = 64
    workers: Sequence[int] = (0, 1, 2)
    decode: str = "fast"
    resize: int = 256
    crop: int = 224
    steps: int = 30
    model_ms: float = 0.0
    device: Optional[str] = None
    seed: int = 0
    transform: Optional[str] = None  # "module:callable" applied after the decode (its GIL use is judged)
    fidelity: int = 16

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.steps < 1:
            raise UsageError("--batch-size and --steps must be >= 1")
        if self.model_ms < 0:
            raise UsageError("--model-ms must be >= 0")
        if not self.workers or any(w < 0 for w in self.workers):
            raise UsageError("--workers must list integers >= 0")
        if self.fidelity < 0:
            raise UsageError("--fidelity must be >= 0")


def run_bench(path: str | os.PathLike, options: BenchOptions | None = None, *,
              against: str | os.PathLike | None = None, progress: bool = True,
              **fields: Any) -> dict[str, Any]:
    """Benchmark the loader of ``path`` per ``num_workers`` against the in-memory ceiling
    (and the same pipeline over the image folder ``against``, when given).

    ``options`` (or its fields as keywords: ``batch_size=``, ``workers=``, ...) say what to run.
    Returns the dict described in this module's docstring (the ``--json`` output).
    Arguments are checked before any work starts.
    """
    o = dataclasses.replace(options or BenchOptions(), **fields)
    batch_size, workers, decode, resize, crop = o.batch_size, o.workers, o.decode, o.resize, o.crop
    steps, model_ms, device, seed = o.steps, o.model_ms, o.device, o.seed
    if against is not None and not Path(against).is_dir():
        raise UsageError(f"--against {against}: not a folder")
    pipeline = make_decode(decode, resize, crop)
    from packer.commands.bench_threads import load_transform, order_mixing, thread_scaling

    user_transform = load_transform(o.transform)

    import torch
    from tqdm import tqdm

    from packer.data.cache import cache_bytes, free_memory
    from packer.data.datasets import PackedDataset
    from packer.data.prefetch import resolve_device

    dev = resolve_device(device)
    dataset = PackedDataset(path, decode=pipeline, transform=user_transform)
    folder = FolderDataset(against, pipeline) if against is not None else None
    pin = dev.type == "cuda"
    result: dict[str, Any] = {
        "path": str(path), "format": dataset.manifest.format, "count": len(dataset),
        "batch_size": batch_size, "steps": steps, "decode": decode, "resize": resize, "crop": crop,
        "model_ms": model_ms, "device": str(dev) + (f" ({torch.cuda.get_device_name(dev)})" if pin else ""),
        "cpu_count": os.cpu_count() or 1, "sample_bytes": _sample_bytes(dataset.reader),
    }
    mb = result["sample_bytes"] / 1e6
    total = (steps + 1) * (1 + len(workers) * (2 if folder is not None else 1))
    with tqdm(total=total, desc="bench", unit="batch", disable=None if progress else True) as bar:
        # The ceiling: a few real batches held in memory, replayed through the same consumer.
        try:
            held = list(_loader(dataset, num_workers=0, batch_size=batch_size, batches=min(steps + 1, 4),
                                seed=seed, pin=pin))
        except ValueError as e:
            raise UsageError(f"{path}: cannot batch samples with --decode {decode}: {e}") from None
        ceiling = _measure(_Replay(held, steps + 1), device=dev, steps=steps, batch_size=batch_size,
                           model_ms=model_ms, tick=bar.update)
        result["ceiling"] = {"samples_per_s": ceiling["samples_per_s"],
                             "mb_per_s": ceiling["samples_per_s"] * mb}
        shape = tuple(held[0][0].shape[1:]) if isinstance(held[0][0], torch.Tensor) else None
        del held
        settings = []
        for w in workers:
            bar.set_postfix_str(f"num_workers={w}")
            loader = _loader(dataset, num_workers=w, batch_size=batch_size, batches=steps + 1, seed=seed, pin=pin)
            s = {"num_workers": w, **_measure(loader, device=dev, steps=steps, batch_size=batch_size,
                                              model_ms=model_ms, tick=bar.update)}
            s["mb_per_s"] = s["samples_per_s"] * mb
            s["ratio_to_ceiling"] = s["samples_per_s"] / max(ceiling["samples_per_s"], 1e-9)
            s["data_bound"] = s["ratio_to_ceiling"] < DATA_BOUND_BELOW
            s["slowdown"] = max(1.0, 1 / max(s["ratio_to_ceiling"], 1e-9))
            s["verdict"] = _verdict(s, ceiling["samples_per_s"])
            s["against"] = None
            if folder is not None:
                loader = _loader(folder, num_workers=w, batch_size=batch_size, batches=steps + 1, seed=seed, pin=pin)
                f = _measure(loader, device=dev, steps=steps, batch_size=batch_size, model_ms=model_ms,
                             tick=bar.update)
                s["against"] = {"samples_per_s": f["samples_per_s"],
                                "ratio": s["samples_per_s"] / max(f["samples_per_s"], 1e-9)}
            settings.append(s)
    result["settings"] = settings
    if shape is not None:
        need, free = cache_bytes(len(dataset), shape), free_memory(dev)
        result["cache"] = {"sample_shape": list(shape), "bytes": need, "free_bytes": free,
                           "fits": free is not None and need <= CACHE_FITS_FRACTION * free, "device": str(dev)}
    else:
        result["cache"] = None
    try:
        result["threads"] = thread_scaling(dataset, batch_size=batch_size, batches=min(steps, 8))
    except PackerError as e:  # e.g. images of different sizes with --decode tensor
        log.warning("thread scaling not measured: %s", e)
        result["threads"] = None
    result["mixing"] = order_mixing(dataset, batch_size=batch_size)
    result["recommended"] = _recommend(result)
    pick = next(s for s in settings if s["num_workers"] == result["recommended"]["num_workers"])
    result["verdict"] = f"num_workers={pick['num_workers']}: {pick['verdict']}"
    from packer.commands.fidelity import dataset_fidelity

    result["fidelity"] = dataset_fidelity(dataset.reader, count=o.fidelity, short_side=resize,
                                          crop=crop) if o.fidelity else []
    return result


def format_report(result: dict[str, Any]) -> str:
    """The human-readable table of a ``run_bench`` result."""
    r = result
    lines = [f"{r['path']}: {r['format']}, {r['count']} samples, {r['sample_bytes'] / 1e3:.1f} KB/sample stored; "
             f"batch {r['batch_size']}, decode {r['decode']} ({r['resize']} -> {r['crop']}), "
             f"device {r['device']}, {r['cpu_count']} CPUs, model step {r['model_ms']:g} ms",
             f"ceiling (same batches from memory, same consumer): {r['ceiling']['samples_per_s']:.0f} samples/s"]
    against = any(s["against"] for s in r["settings"])
    head = f"{'workers':>7} {'samples/s':>10} {'MB/s':>7} {'vs ceiling':>10} {'first batch':>11}"
    head += f" {'vs files':>8}" if against else ""
    lines += [head + "  verdict"]
    for s in r["settings"]:
        row = (f"{s['num_workers']:>7} {s['samples_per_s']:>10.0f} {s['mb_per_s']:>7.1f} "
               f"{s['ratio_to_ceiling']:>9.2f}x {s['first_batch_s']:>9.2f} s")
        if against:
            row += f" {s['against']['ratio']:>7.2f}x"
        lines.append(row + "  " + s["verdict"])
    rec = r["recommended"]
    lines.append(f"recommended: num_workers={rec['num_workers']}, persistent_workers={rec['persistent_workers']}"
                 + (f", prefetch_factor={rec['prefetch_factor']}" if rec["prefetch_factor"] else ""))
    lines += [f"  - {reason}" for reason in rec["reasons"]]
    from packer.commands.bench_threads import format_extras

    lines += format_extras(r)
    c = r["cache"]
    if c:
        free = "unknown" if c["free_bytes"] is None else f"{c['free_bytes'] / 2**30:.2f} GiB free"
        lines.append(f"device cache: {r['count']} x {'x'.join(map(str, c['sample_shape']))} uint8 = "
                     f"{c['bytes'] / 2**30:.2f} GiB; {c['device']} has {free}: "
                     f"{'fits' if c['fits'] else 'does not fit (needs <= half the free memory)'}")
    if r.get("fidelity"):
        from packer.commands.fidelity import format_fidelity

        lines += [f"fidelity on {r['fidelity'][0]['images']} samples (reference: full decode + Lanczos "
                  "from the exact box; shift in output pixels):", format_fidelity(r["fidelity"])]
    return "\n".join(lines)


def plot_bench(result: dict[str, Any], out: str | os.PathLike) -> None:
    """Draw samples/s against num_workers with the ceiling as a line (needs ``packer[plot]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'packer[plot]'") from None
    ws = [s["num_workers"] for s in result["settings"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ws, [s["samples_per_s"] for s in result["settings"]], "o-", label=f"{result['format']} loader")
    if any(s["against"] for s in result["settings"]):
        ax.plot(ws, [s["against"]["samples_per_s"] for s in result["settings"]], "s--", label="original files")
    ax.axhline(result["ceiling"]["samples_per_s"], color="k", linestyle=":", label="ceiling (from memory)")
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s")
    ax.set_xticks(ws)
    ax.set_ylim(bottom=0)
    ax.set_title(f"packer bench: {Path(result['path']).name}, batch {result['batch_size']}, {result['decode']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
