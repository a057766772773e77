"""``packer bench``: is data loading the bottleneck of training, and which ``num_workers`` to use.

For each ``num_workers`` it runs the real ``DataLoader`` (``PackedDataset`` + the chosen decode
pipeline + ``uint8_collate``; into ``DevicePrefetcher`` on a GPU, iterated as a script does on
the CPU: ``packer.benchmark.fresh.child``) and, after one start-up batch, times
``steps`` batches, each setting in a fresh process with packer's default settings, as a training
script starts (``packer.benchmark.fresh``; so are ``--against`` and the thread scaling). In
the same run it measures the *ceiling*: the same kind of batches served
from memory through the same consumer (prefetcher normalization + the simulated model step of
``model_ms``), i.e. what the training loop could take if loading were free. A setting is
data-bound when the loader gives less than 95% of the ceiling.

JSON fields (``packer bench --json``; also ``JSON_FIELDS`` / ``SETTING_FIELDS``):

* ``path``, ``format``, ``count``: the dataset.
* ``batch_size``, ``steps``, ``decode``, ``resize``, ``crop``, ``model_ms``: what was run.
* ``device``: where batches went (``"cpu"`` or the CUDA device with its name); ``cpu_count``.
* ``sample_bytes``: mean stored (encoded) bytes per sample; MB/s = samples/s x this.
* ``decoders``: ``{full, region, backend, library}``: the JPEG decoder of whole images
  (``simplejpeg``, ``opencv`` or ``pillow``: ``packer.codecs.image``) and whether region
  decoding is active (``DecodeRandomResizedCrop`` and ``DecodeResizeCrop`` decode only the
  box), through which backend and library (``packer.codecs.jpeg_region``; null when off).
* ``ceiling``: ``{samples_per_s, mb_per_s}`` of in-memory batches through the same consumer.
* ``settings``: one object per ``num_workers``:
  ``num_workers``, ``samples_per_s``, ``mb_per_s``, ``ratio_to_ceiling`` (loader / ceiling),
  ``data_bound`` (ratio < 0.95), ``slowdown`` (ceiling / loader: how much faster training
  would go with free loading, >= 1), ``first_batch_s`` (time to the first batch of an
  epoch), ``worker_startup_s`` (what starting the workers adds per epoch: first batch minus a
  steady batch), ``wait_ms_median`` / ``wait_ms_p95`` (time the loop waited per batch),
  ``verdict`` (one line), ``against`` (``{samples_per_s, ratio, process}`` reading the original
  files with ``--against``, ratio = packed / files; else null), ``process`` (the fresh process's
  whole life, imports and reaped workers included: ``{wall_s, user_s, sys_s, minflt, majflt,
  maxrss_mb}``) and ``window`` (the epoch it timed, from building the loader, workers included:
  ``{user_s, sys_s, minflt}``; per sample, divide by ``(steps + 1) * batch_size``).
* ``recommended``: ``{num_workers, persistent_workers, prefetch_factor, reasons}``.
* ``cache``: ``{sample_shape, bytes, free_bytes, fits, device}`` for
  ``DevicePrefetcher.cache`` (fits = bytes <= half the free memory, leaving the rest to the
  model); null when samples have no fixed shape.
* ``verdict``: one line for the recommended setting.
* ``threads``: ``packer.Loader`` with 1 and N threads over the same samples:
  ``{threads, one_thread_samples_per_s, samples_per_s, scaling, available, cpus, process, holds_gil,
  advice}``, each thread count in a fresh process (``process``: ``{"1": {...}, "N": {...}}``, each
  the process's figures above with its ``window``); ``available``: the scaling GIL-free work got
  at the same moment; ``holds_gil``: N threads give < 1.3x one thread: use the DataLoader (null
  when the machine was too busy to tell); null if not batchable.
* ``mixing``: distinct classes per batch, ``{batch_size, iid, stored: {median, p10, ratio},
  streaming: {...}}`` for the stored order and ``StreamingDataset``'s default order against
  the exact iid expectation (ratio = median / iid); null for one class.
* ``fidelity``: per fast decode path and its torchvision pipeline, median PSNR against a
  full-decode Lanczos reference and the measured shift over ``--fidelity`` samples
  (``packer.benchmark.fidelity``; rows ``pipeline, kind, images, psnr_median, psnr_p10,
  shift_median, shift_max``); empty with ``--fidelity 0``.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from packer.errors import PackerError, UsageError
# the measuring loop and the report live beside this module; their public names stay importable here
from packer.benchmark.measure import (DECODES, FolderDataset, Replay, make_decode, measure, sample_bytes,
                                           timed_loader)
from packer.benchmark.report import DATA_BOUND_BELOW, format_report, plot_bench, recommend, verdict

__all__ = ["DECODES", "JSON_FIELDS", "SETTING_FIELDS", "FolderDataset", "make_decode", "run_bench",
           "format_report", "plot_bench", "parse_workers", "jpeg_decoders"]

log = logging.getLogger(__name__)

CACHE_FITS_FRACTION = 0.5

JSON_FIELDS = {
    "path": "the dataset path", "format": "its packed format", "count": "samples in it",
    "batch_size": "samples per batch", "steps": "batches timed per setting",
    "decode": "decode pipeline (fast | pil | tensor)", "resize": "short side resized to",
    "crop": "centre crop side", "model_ms": "simulated training step (ms)",
    "device": "where batches went", "cpu_count": "CPUs of this machine",
    "sample_bytes": "mean stored bytes per sample", "ceiling": "{samples_per_s, mb_per_s} from memory",
    "decoders": "{full, region, backend, library}: the JPEG decoder and whether region decoding is active",
    "settings": "one object per num_workers", "recommended": "{num_workers, persistent_workers, "
    "prefetch_factor, reasons}", "cache": "{sample_shape, bytes, free_bytes, fits, device} or null",
    "verdict": "one line for the recommended setting",
    "threads": "{threads, one_thread_samples_per_s, samples_per_s, scaling, available, cpus, process, "
               "holds_gil, advice} or null, each thread count in a fresh process",
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
    "against": "{samples_per_s, ratio, process} over the original files, or null",
    "process": "the setting's fresh process: {wall_s, user_s, sys_s, minflt, majflt, maxrss_mb}",
    "window": "the timed epoch in it, workers included: {user_s, sys_s, minflt}",
}


def jpeg_decoders() -> dict[str, Any]:
    """The JPEG decoders of this install: whole images, and region decoding (on or off)."""
    from packer.codecs import image, jpeg_region

    return {"full": image.DECODER, "region": jpeg_region.available(), "backend": jpeg_region.backend(),
            "library": jpeg_region.library_path()}


def parse_workers(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``; UsageError for anything else."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--workers must be comma-separated integers like 0,1,2, not {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise UsageError(f"--workers must list integers >= 0, not {text!r}")
    return sorted(set(values))


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
    from packer.benchmark.threads import load_transform, order_mixing, thread_scaling

    user_transform = load_transform(o.transform)

    from packer.benchmark.fresh import FreshProcesses  # here: `packer --help` imports this module

    # the fresh processes' server imports torch and packer while this process does the same
    fresh = FreshProcesses().start()
    try:
        import torch
        from tqdm import tqdm

        from packer.data.device import cache_bytes, free_memory
        from packer.data.datasets import PackedDataset
        from packer.data.device import resolve_device

        dev = resolve_device(device)
        dataset = PackedDataset(path, decode=pipeline, transform=user_transform)
        folder = FolderDataset(against, pipeline) if against is not None else None
        pin = dev.type == "cuda"
        result: dict[str, Any] = {
            "path": str(path), "format": dataset.manifest.format, "count": len(dataset),
            "batch_size": batch_size, "steps": steps, "decode": decode, "resize": resize, "crop": crop,
            "model_ms": model_ms, "device": str(dev) + (f" ({torch.cuda.get_device_name(dev)})" if pin else ""),
            "cpu_count": os.cpu_count() or 1, "sample_bytes": sample_bytes(dataset.reader),
            "decoders": jpeg_decoders(),
        }
    except BaseException:
        fresh.close()
        raise
    mb = result["sample_bytes"] / 1e6
    total = (steps + 1) * (1 + len(workers) * (2 if folder is not None else 1))
    with tqdm(total=total, desc="bench", unit="batch", disable=None if progress else True) as bar, fresh:
        # The ceiling: a few real batches held in memory, replayed through the same consumer.
        try:
            held = list(timed_loader(dataset, num_workers=0, batch_size=batch_size,
                                     batches=min(steps + 1, 4), seed=seed, pin=pin))
        except ValueError as e:
            raise UsageError(f"{path}: cannot batch samples with --decode {decode}: {e}") from e
        fresh.ready()  # nothing else competes for the CPUs while anything is timed
        ceiling = measure(Replay(held, steps + 1), device=dev, steps=steps, batch_size=batch_size,
                          model_ms=model_ms, tick=bar.update)
        result["ceiling"] = {"samples_per_s": ceiling["samples_per_s"],
                             "mb_per_s": ceiling["samples_per_s"] * mb}
        shape = tuple(held[0][0].shape[1:]) if isinstance(held[0][0], torch.Tensor) else None
        del held
        settings = []
        # every loader configuration in a fresh process with default settings (fresh)
        base = {"path": os.path.abspath(path), "decode": decode, "resize": resize, "crop": crop,
                "transform": o.transform, "device": device, "seed": seed, "steps": steps,
                "batch_size": batch_size, "model_ms": model_ms, "sys_path": [p for p in sys.path if p]}
        for w in workers:
            bar.set_postfix_str(f"num_workers={w}")
            s = {"num_workers": w, **fresh.run({**base, "kind": "loader", "num_workers": w})}
            bar.update(steps + 1)
            s["mb_per_s"] = s["samples_per_s"] * mb
            s["ratio_to_ceiling"] = s["samples_per_s"] / max(ceiling["samples_per_s"], 1e-9)
            s["data_bound"] = s["ratio_to_ceiling"] < DATA_BOUND_BELOW
            s["slowdown"] = max(1.0, 1 / max(s["ratio_to_ceiling"], 1e-9))
            s["verdict"] = verdict(s, ceiling["samples_per_s"])
            s["against"] = None
            if folder is not None:
                f = fresh.run({**base, "kind": "folder", "path": os.path.abspath(against), "num_workers": w})
                bar.update(steps + 1)
                s["against"] = {"samples_per_s": f["samples_per_s"],
                                "ratio": s["samples_per_s"] / max(f["samples_per_s"], 1e-9),
                                "process": {**f["process"], "window": f["window"]}}
            settings.append(s)
        result["settings"] = settings
        try:
            result["threads"] = thread_scaling(base, runner=fresh, batch_size=batch_size, batches=min(steps, 8))
        except PackerError as e:  # e.g. images of different sizes with --decode tensor
            log.warning("thread scaling not measured: %s", e)
            result["threads"] = None
    if shape is not None:
        need, free = cache_bytes(len(dataset), shape), free_memory(dev)
        result["cache"] = {"sample_shape": list(shape), "bytes": need, "free_bytes": free,
                           "fits": free is not None and need <= CACHE_FITS_FRACTION * free, "device": str(dev)}
    else:
        result["cache"] = None
    result["mixing"] = order_mixing(dataset, batch_size=batch_size)
    result["recommended"] = recommend(result)
    pick = next(s for s in settings if s["num_workers"] == result["recommended"]["num_workers"])
    result["verdict"] = f"num_workers={pick['num_workers']}: {pick['verdict']}"
    from packer.benchmark.fidelity import dataset_fidelity

    result["fidelity"] = dataset_fidelity(dataset.reader, count=o.fidelity, short_side=resize,
                                          crop=crop) if o.fidelity else []
    return result
