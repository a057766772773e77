"""Reading: packer's datasets and loaders against the in-memory ceiling and the peers.

Every configuration runs in a FRESH Python process with default settings, as a user's training
script runs it (no thread pinning, no heap tuning unless the row says ``tuned``). Each row
records, beside samples/s over the timed batches, the user and system CPU seconds and minor page
faults of that window (the process, its loader threads and its DataLoader workers, from /proc)
and of the child's whole life (``os.wait4``: start-up, imports and workers included).

Sections (``--section``, comma-separated, or ``all``):

* ``loaders`` (default): ``Resize(256) + CenterCrop(224)`` to uint8 CHW, batch 64, over the
  in-memory ceiling (encoded bytes in a list), the ImageFolder tree, every packer format
  and the peers (webdataset, litdata, mosaicml-streaming; each skipped with a line when not
  installed), two decodes (``packer``: ``DecodeResizeCrop``; ``pillow``: the peers' documented
  Pillow default), ``DataLoader`` at ``--workers`` and ``packer.Loader`` at ``--threads``, and
  the same Loader/DataLoader rows with ``packer.heap.tune_heap()`` called first (``tuned``).
* ``ipc``: where a ``DataLoader``'s system time goes: packer/lmdb at ``--workers``' largest value
  with the default collate (workers reuse their batch buffers), packer's ``uint8_collate``, the
  batch read by the main process, ``pin_memory`` (with CUDA only), and torch's new segment per
  batch (``PACKER_REUSE_BATCHES=0``; also with the ``file_system`` sharing strategy); the
  in-memory ceiling and ``packer.Loader`` beside them.
* ``training``: ``RandomResizedCrop(224)`` + flip, 2 threads or workers per row: packer/lmdb,
  packer/hdf5 and raw HDF5 pixels through ``Loader`` and ``DataLoader``, against SPDL, DALI (CPU),
  FFCV and webdataset where installed, and the CPU limit: the bare loop of simplejpeg's DCT-scaled
  decode + crop + ``cv2.resize`` bilinear + flip into a reused batch buffer (``cpu_limits``).
* ``formats``: every format's ``PackedDataset(decode="tensor")`` (CRC checked and, for records,
  not), ``StreamingDataset``, against the in-memory ceiling, full decode + fixed centre crop.
* ``raw``: the same images packed at 224x224 as LMDB-JPEG, HDF5-JPEG and HDF5 raw pixels.
* ``costs``: CPU per sample of each part in one process (fetching the encoded bytes from each
  source, each decode pipeline, the CRC32C check): what bounds the ratios above.
* ``shuffle``: ``StreamingDataset``'s default block shuffle against shard order + buffer on a
  class-sorted records pack: classes per 256-batch against iid, and read throughput.
* ``crops``: decode-time crops per core (region decode against full decode, torchvision and the
  CPU limit, the bare simplejpeg + ``cv2.resize`` loop of each pipeline) and fidelity.
* ``prefetch``: host-side cost per batch of the uint8 path against float32 normalization on the
  CPU, and the CUDA ``DevicePrefetcher``'s host time where a GPU is present.
* ``bench``: ``packer bench``'s loader rows against a plain DataLoader script on the same pack,
  decode, collate and ``num_workers`` (target: within 10%).

The peers' dependencies clash with packer's (MosaicML Streaming needs a torchvision built for its
torch), so they live in their own virtual environment: ``--peer-python`` (or
``$PACKER_BENCH_PEER_PYTHON``) names its interpreter. The peers are probed by importing them
there, their writers pack the same JPEGs there and their rows run there; packer's rows run in
this interpreter. One more row, packer's default DataLoader in the peers' interpreter, shows
what the other torch changes. The peers' environment needs packer's own dependencies too (the
rows import this checkout's ``packer`` for the shared Pillow decode); CONTRIBUTING.md ("The peers
the read benchmark compares with") gives the recipe that installs all six peers in one::

    python -m scripts.bench.read --section loaders,training --peer-python .venv-peers/bin/python

Opt-in sections (not in ``all``):

* ``stream-baseline``: one single-source ``StreamingDataset(decode="bytes")`` epoch over the
  shuffle section's records pack and an LMDB of the same images, this checkout against another
  one (``--base-tree``, e.g. ``git worktree add ../base <commit>``): the other checkout's rows
  run in it, its packer and its copy of this module's ``stream`` child.

Run from the repository root with packer importable::

    python -m scripts.bench.read                       # loaders, ~8 min on 2 cores
    python -m scripts.bench.read --section all         # every section, ~20 min
    python -m scripts.bench.read --quick --section all # smoke run, ~1 min
"""
from __future__ import annotations

import argparse
import importlib
import io
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from scripts.bench.common import (REPO, descendants, fork_rows, image_folder, machine_info, md_table, proc_usage, run_fresh,
                                  target, usage_delta, write_result)

MODULE = "scripts.bench.read"
SECTIONS = ("loaders", "ipc", "training", "formats", "raw", "costs", "shuffle", "crops", "prefetch", "bench")
OPT_IN = ("stream-baseline",)  # sections ``all`` leaves out: they need an argument
PEERS = ("webdataset", "litdata", "mds")
TRAIN_PEERS = ("spdl", "dali", "ffcv", "webdataset")
PEER_MODULES = {"webdataset": "webdataset", "litdata": "litdata", "mds": "streaming", "spdl": "spdl",
                "dali": "nvidia.dali", "ffcv": "ffcv"}
# what the --quick row server imports once before it forks the rows (common.fork_rows)
FORK_PRELOAD = ("torch.utils.data", "PIL.Image", "packer", "packer.data.datasets", "packer.data.loader",
                "packer.formats", "packer.codecs.image")
CROP = (368, 496)  # formats: every ~432x576 image is at least 378x504 (1/8 jitter)


# == the data (parent) ================================================================================
def packed(src: Path, out: Path, fmt: str, **options: Any) -> str:
    """Pack ``src`` as ``fmt`` once (kept while the image set is unchanged)."""
    import packer

    stamp = out.parent / f"{out.name}.done"
    marker = src.parent / f"{src.name}.json"
    key = json.dumps({"images": marker.read_text() if marker.exists() else "", "options": repr(sorted(options.items()))})
    if not (stamp.exists() and stamp.read_text() == key):
        t = time.perf_counter()
        report = packer.pack(src, out, format=fmt, overwrite=True, **options)
        stamp.write_text(key)
        print(f"packed {out.name}: {report.summary()} ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    return str(out)


def _peer_item(pair: tuple[str, int]) -> dict[str, Any]:
    path, label = pair
    return {"image": Path(path).read_bytes(), "label": label}


def build_peer(peer: str, items: list[Any], work: Path) -> Any:
    """The peer's own format of the same images, made once (in the peers' interpreter:
    ``built_peer``)."""
    d = work / peer
    if peer == "webdataset":
        import webdataset as wds

        if not (d / ".complete").exists():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            with wds.ShardWriter(str(d / "shard-%05d.tar"), maxcount=625, verbose=0) as sink:
                for it in items:
                    sink.write({"__key__": f"{it.label}_{Path(it.key).stem}", "jpg": Path(it.path).read_bytes(),
                                "cls": it.label})
            (d / ".complete").write_text("ok")
        return sorted(str(p) for p in d.glob("shard-*.tar"))
    if peer == "litdata":
        import litdata

        if not (d / ".complete").exists():
            shutil.rmtree(d, ignore_errors=True)
            litdata.optimize(fn=_peer_item, inputs=[(it.path, it.label) for it in items], output_dir=str(d),
                             chunk_bytes="64MB", num_workers=1, verbose=False, start_method="fork")
            (d / ".complete").write_text("ok")
        return str(d)
    if peer == "mds":
        from streaming import MDSWriter

        if not (d / ".complete").exists():
            shutil.rmtree(d, ignore_errors=True)
            with MDSWriter(out=str(d), columns={"image": "bytes", "label": "int"}) as w:
                for it in items:
                    w.write({"image": Path(it.path).read_bytes(), "label": it.label})
            (d / ".complete").write_text("ok")
        return str(d)
    if peer == "ffcv":
        from ffcv.fields import IntField, RGBImageField
        from ffcv.writer import DatasetWriter
        from PIL import Image

        class Items:  # FFCV's writer takes an indexed dataset of (PIL image, label)
            def __len__(self) -> int:
                return len(items)

            def __getitem__(self, i: int):
                return Image.open(items[i].path).convert("RGB"), items[i].label

        if not (d / ".complete").exists():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            DatasetWriter(str(d / "train.beton"), {"image": RGBImageField(write_mode="jpg", jpeg_quality=90),
                                                   "label": IntField()}, num_workers=2).from_indexed_dataset(Items())
            (d / ".complete").write_text("ok")
        return str(d / "train.beton")
    return None


def peer_env(python: str | None, peers: list[str], skipped: dict[str, str]) -> tuple[list[str], dict[str, Any]]:
    """The peers that import in ``python`` (a fresh process of the peers' interpreter: an import,
    not a look-up, so a package that is installed but broken is skipped too), and that
    interpreter's versions; each other peer gets a line in ``skipped``."""
    where = python or sys.executable
    if not peers:
        return [], {"python": where}
    r = run_fresh(MODULE, {"kind": "probe", "modules": {p: PEER_MODULES[p] for p in peers}}, python=python)
    if "error" in r:
        for p in peers:
            skipped[p] = f"the peers' interpreter {where} failed: {r['error']}"
            print(f"skipped {p}: {skipped[p]}", file=sys.stderr)
        return [], {"python": where}
    out = []
    for p in peers:
        err = r["errors"].get(p)
        if err is None:
            out.append(p)
            continue
        skipped[p] = (f"not installed in {where} (pip install the {PEER_MODULES[p]} package to include it)"
                      if err.startswith("ModuleNotFoundError") else f"does not import in {where}: {err}")
        print(f"skipped {p}: {skipped[p]}", file=sys.stderr)
    return out, {"python": where, "torch": r.get("torch"), "versions": r["versions"]}


def child_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Import each peer's module here: its version, or the error."""
    versions, errors = {}, {}
    for peer, module in spec["modules"].items():
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - any import failure skips the peer, with its reason
            errors[peer] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        else:
            versions[peer] = dist_version(module, mod)
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {"versions": versions, "errors": errors, "torch": torch_version, "python": sys.executable}


def dist_version(module: str, mod: Any) -> str:
    """The version of the installed distribution that holds ``module`` (a package's own
    ``__version__`` can be stale: ffcv 1.0.2's says 0.0.3rc1), else its ``__version__``."""
    from importlib import metadata

    top, leaf = module.split(".")[0], module.split(".")[-1]
    for dist in metadata.packages_distributions().get(top, []):
        if leaf in dist.lower():  # nvidia.dali: nvidia-dali-cuda130, not one of the other nvidia-* wheels
            return metadata.version(dist)
    root = sys.modules.get(top, mod)
    return str(getattr(mod, "__version__", None) or getattr(root, "__version__", "?"))


def built_peer(peer: str, items: list[Any], work: Path, python: str | None) -> Any:
    """The peer's own format of the same images, written by the peer's own writer in a fresh
    process of the peers' interpreter (``child_build``); raises RuntimeError when it fails."""
    r = run_fresh(MODULE, {"kind": "build", "peer": peer, "work": str(work),
                           "items": [[str(it.path), int(it.label), str(it.key)] for it in items]},
                  python=python, timeout=1800)
    if "error" in r:
        raise RuntimeError(f"writing the {peer} copy failed: {r['error']}")
    return r["path"]


def child_build(spec: dict[str, Any]) -> dict[str, Any]:
    from types import SimpleNamespace

    items = [SimpleNamespace(path=p, label=label, key=key) for p, label, key in spec["items"]]
    return {"path": build_peer(spec["peer"], items, Path(spec["work"]))}


# == one configuration (child) =========================================================================
class InMemory:
    """The ceiling: the encoded bytes already in a list, decoded like every other row, in a
    process whose heap is tuned as a packer reader tunes it (``packer.heap``) and whose
    DataLoader workers reuse their batch buffers as a packer dataset's do
    (``packer.data.batch_memory``): otherwise the "ceiling" pays taxes packer's default no
    longer does."""

    def __init__(self, files: list[str], labels: list[int], decode: Callable[[Any], Any]):
        from packer.heap import tune_heap

        tune_heap()
        self.blobs = [Path(f).read_bytes() for f in files]
        self.labels, self.decode = labels, decode

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):
        from packer.data import batch_memory

        batch_memory.use_in_worker()
        return self.decode(self.blobs[i]), self.labels[i]


class _Floor:
    """The least a checked read of a packer output does, as a map-style dataset with no packer
    reader: the ceiling's process and worker settings (``InMemory``), the file opened once per
    process, each sample's stored bytes copied out (a check of bytes that can still change under
    it checks nothing) and their CRC32C compared with the stored one, the image decoded like every
    row's. A row of it beside the ceiling's says what that read costs at the least: the bound a
    packer reader is held to."""

    def __init__(self, path: str, decode: Callable[[Any], Any]):
        from packer.heap import tune_heap

        tune_heap()
        self.path, self.decode = path, decode
        self._pid: int | None = None
        self.crcs = self._tables()

    def _tables(self) -> list[int]:
        """The stored CRC32Cs (and whatever else the format keeps beside its samples)."""
        raise NotImplementedError

    def _open(self) -> None:
        raise NotImplementedError

    def _read(self, i: int) -> bytes:
        """Sample ``i``'s stored bytes."""
        raise NotImplementedError

    def _unpack(self, i: int, value: bytes) -> tuple[Any, int]:
        """(the image the decode takes, the label) of sample ``i``'s checked bytes."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.crcs)

    def __getitem__(self, i: int):
        from packer.data import batch_memory
        from packer.integrity import crc32c

        batch_memory.use_in_worker()
        if self._pid != os.getpid():  # (a forked worker opens its own)
            self._open()
            self._pid = os.getpid()
        value = self._read(i)
        if crc32c(value) != self.crcs[i]:
            raise ValueError(f"{self.path}: sample {i}: CRC32C mismatch")
        image, label = self._unpack(i, value)
        return self.decode(image), label


class LmdbFloor(_Floor):
    """``_Floor`` of a packer LMDB: py-lmdb's ``get`` (a copy out of the map), the CRC32C against
    ``checksums.bin``, the Datum parsed."""

    def _tables(self) -> list[int]:
        return np.fromfile(Path(self.path) / "checksums.bin", dtype="<u4").tolist()

    def _open(self) -> None:
        from packer.formats.lmdb.env import open_env

        self._txn = open_env(self.path).begin(buffers=False)  # (py-lmdb maps a file once per process)

    def _read(self, i: int) -> bytes:
        from packer.formats.lmdb.env import lmdb_key

        return self._txn.get(lmdb_key(i))

    def _unpack(self, i: int, value: bytes) -> tuple[Any, int]:
        from packer.codecs.protowire import decode_datum

        datum = decode_datum(value)
        return datum.data, datum.label


class RawFloor(_Floor):
    """``_Floor`` of a packer HDF5 of raw pixels, one sample a chunk: h5py only for the tables
    and the chunks' file offsets (once), then one positioned read per sample; the pixels copied
    into a 3xHxW tensor, as ``decode="tensor"`` gives them."""

    def __init__(self, path: str):
        import torch

        from packer.codecs.image import to_chw

        super().__init__(path, lambda arr: torch.from_numpy(to_chw(arr)))

    def _tables(self) -> list[int]:
        import h5py

        from packer.formats.hdf5.columns import chunk_table

        with h5py.File(self.path, "r") as f:
            pixels = f["pixels"]
            self.shape, self.table = pixels.shape[1:], chunk_table(pixels)
            if self.table is None or pixels.chunks[0] != 1:
                raise ValueError(f"{self.path}: 'pixels' is not one plain chunk a sample")
            self.labels = f["labels"][:].tolist()
            return f["crc32c"][:].tolist()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_RDONLY)

    def _read(self, i: int) -> bytes:
        return os.pread(self._fd, math.prod(self.shape), int(self.table[i]))

    def _unpack(self, i: int, value: bytes) -> tuple[Any, int]:
        return np.frombuffer(value, np.uint8).reshape(self.shape), self.labels[i]


class Folder:
    """ImageFolder style: torchvision's pil_loader (open + convert RGB) for Pillow, else bytes."""

    def __init__(self, files: list[str], labels: list[int], decode: Callable[[Any], Any], pillow: bool):
        self.files, self.labels, self.decode, self.pillow = files, labels, decode, pillow

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        with open(self.files[i], "rb") as f:
            if self.pillow:
                from PIL import Image

                return self.decode(Image.open(f).convert("RGB")), self.labels[i]
            return self.decode(f.read()), self.labels[i]


class _ImageLabel:
    """A streaming peer's item dict -> (decoded image, label)."""

    def __init__(self, decode: Callable[[Any], Any]):
        self.decode = decode

    def __call__(self, item: dict[str, Any]):
        return self.decode(item["image"]), item["label"]


def center_crop(image: Any) -> Any:
    """A fixed centre crop of a CHW tensor so that full-decode batches stack (formats section)."""
    h, w = image.shape[1:]
    top, left = (h - CROP[0]) // 2, (w - CROP[1]) // 2
    return image[:, top:top + CROP[0], left:left + CROP[1]].contiguous()


def pipeline(name: str) -> Callable[[Any], Any]:
    """The per-sample decode of a row: ``packer`` / ``pillow`` (resize 256 + centre crop 224),
    ``train`` (packer's RandomResizedCrop(224) + flip)."""
    if name == "packer":
        from packer.data.decode import DecodeResizeCrop

        return DecodeResizeCrop(256, 224)
    if name == "pillow":
        from packer.data.decode import PilResizeCrop

        return PilResizeCrop(256, 224)
    if name == "train":
        from packer.data.decode import DecodeRandomResizedCrop

        return DecodeRandomResizedCrop(224)
    raise ValueError(f"unknown pipeline {name!r}")


CPU_LIMIT_WHAT = {
    "packer": "simplejpeg DCT-scaled decode + cv2.resize bilinear + centre crop into a reused buffer",
    "train": "simplejpeg DCT-scaled decode + crop + cv2.resize bilinear + flip into a reused buffer"}


def cpu_limits() -> dict[str, Callable[[bytes, Any, np.ndarray], None]]:
    """The CPU's limit of each pipeline (issue 43): the bare loop body a decode-crop is measured
    against, or ``{}`` without simplejpeg. ``fn(data, rng, out)`` writes one 224x224x3 image
    into ``out`` (a reused buffer), with no fidelity care beyond OpenCV's bilinear:

    * ``packer`` (``Resize(256) + CenterCrop(224)``): decode at the power-of-two DCT scale that
      keeps the short side >= 256 (libjpeg-turbo's SIMD IDCTs; its other M/8 scales are slower
      than a full decode: 1.21 against 1.00 ms for a 576x432 JPEG at 5/8), ``cv2.resize``
      bilinear to torchvision's resized size, the centre square copied out;
    * ``train`` (``RandomResizedCrop(224)`` + flip): packer's box draw (``rng``), the
      power-of-two scale that keeps the box >= 224, the box rounded to the scaled pixels,
      ``cv2.resize`` bilinear, flipped into ``out`` at random.
    """
    try:
        import cv2
        import simplejpeg
    except ImportError:
        return {}
    from packer.data.decode import DecodeRandomResizedCrop, reduction_factor, reduction_for, resized_size

    draw = DecodeRandomResizedCrop(224)

    def scaled(data: bytes, k: int, height: int, width: int) -> np.ndarray:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-height // k), min_width=-(-width // k))

    def centre(data: bytes, rng: Any, out: np.ndarray) -> None:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        arr = scaled(data, reduction_factor(height, width, 256), height, width)
        rh, rw = resized_size(height, width, 256)
        small = cv2.resize(arr, (rw, rh), interpolation=cv2.INTER_LINEAR)
        top, left = round((rh - 224) / 2), round((rw - 224) / 2)
        np.copyto(out, small[top:top + 224, left:left + 224])

    def train(data: bytes, rng: Any, out: np.ndarray) -> None:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        (top, left, h, w), flip = draw.sample(height, width, rng)
        k = reduction_for(h, w, 224, 224)
        arr = scaled(data, k, height, width)
        crop = cv2.resize(arr[top // k:(top + h) // k, left // k:(left + w) // k], (224, 224),
                          interpolation=cv2.INTER_LINEAR)
        if flip:
            cv2.flip(crop, 1, dst=out)
        else:
            np.copyto(out, crop)

    return {"packer": centre, "train": train}


def make_dataset(spec: dict[str, Any]) -> tuple[Any, bool]:
    """(dataset, map_style) of one row."""
    source, pipe = spec["source"], spec["pipeline"]
    if source.startswith(("packer/", "stream/")):
        path = spec["path"]
        kwargs = dict(spec.get("dataset_options", {}))
        if pipe == "tensor":
            kwargs.update(decode="tensor", transform=center_crop if spec.get("crop", True) else None)
        else:
            kwargs["decode"] = pipeline(pipe)
        if source.startswith("stream/"):
            from packer import StreamingDataset

            return StreamingDataset(path, batch_size=spec["batch_size"], **kwargs), False
        from packer import PackedDataset

        return PackedDataset(path, **kwargs), True
    if source == "floor/lmdb":
        return LmdbFloor(spec["path"], pipeline(pipe)), True
    if source == "floor/hdf5-raw224":
        return RawFloor(spec["path"]), True
    if source in ("ceiling", "folder"):
        if pipe == "tensor":
            from packer.data.datasets import decode_record

            def decode(data: bytes) -> Any:
                return center_crop(decode_record(data, "tensor"))
        else:
            decode = pipeline(pipe)
        files, labels = spec["files"], spec["labels"]
        if source == "ceiling":
            return InMemory(files, labels, decode), True
        return Folder(files, labels, decode, pillow=pipe == "pillow"), True
    raise ValueError(f"unknown source {source!r}")


def make_loader(spec: dict[str, Any]) -> Any:
    """The row's loader, built as a user's script builds it: defaults but for batch, shuffle and
    the parallelism the row names."""
    import torch

    kind, par, bs = spec["loader"], spec["parallel"], spec["batch_size"]
    source = spec["source"]
    if source in PEERS or source in TRAIN_PEERS:
        return peer_loader(spec)
    ds, map_style = make_dataset(spec)
    if kind == "Loader":
        from packer import Loader

        return Loader(ds, batch_size=bs, shuffle=map_style, num_threads=par)
    if spec.get("sharing"):  # ipc section: torch's other way to hand a worker's tensors over
        torch.multiprocessing.set_sharing_strategy(spec["sharing"])
    options = {"collate_fn": COLLATES[spec["collate"]]} if spec.get("collate") else {}
    return torch.utils.data.DataLoader(ds, batch_size=bs, shuffle=map_style, num_workers=par,
                                       persistent_workers=spec.get("persistent", False) and par > 0,
                                       pin_memory=spec.get("pin_memory", False), **options)


def _uint8_collate(batch: list[Any]) -> Any:
    from packer.data import uint8_collate

    return uint8_collate(batch)


COLLATES = {"uint8": _uint8_collate}


def touch_pages(batch: Any) -> None:
    """Read one byte of every page of the batch's images, as a copy to the GPU or into pinned
    memory would: the main process maps the worker's pages."""
    import torch

    images = batch[0]
    flat = images.reshape(-1) if isinstance(images, torch.Tensor) else torch.from_numpy(images).reshape(-1)
    int(flat[::4096].sum())


def peer_loader(spec: dict[str, Any]) -> Any:
    """A peer's own pipeline over its own format (``DataLoader`` with the row's workers unless
    the peer has its own loader)."""
    import torch

    source, par, bs = spec["source"], spec["parallel"], spec["batch_size"]
    if spec["pipeline"] == "train":
        return train_peer(spec)
    pillow = spec["pipeline"] == "pillow"
    decode = pipeline(spec["pipeline"])
    if source == "webdataset":
        import webdataset as wds

        ds = wds.WebDataset(spec["path"], shardshuffle=len(spec["path"]), empty_check=False).shuffle(1000)
        if pillow:
            ds = ds.decode("pil")
        ds = ds.to_tuple("jpg", "cls").map_tuple(decode, int)
        return torch.utils.data.DataLoader(ds, batch_size=bs, num_workers=par)
    if source == "litdata":
        import litdata

        ds = litdata.StreamingDataset(spec["path"], shuffle=True, transform=_ImageLabel(decode),
                                      cache_dir=spec["path"] + "-cache")
        return litdata.StreamingDataLoader(ds, batch_size=bs, num_workers=par)
    if source == "mds":
        import streaming

        class MDSImages(streaming.StreamingDataset):  # fork start method: never pickled
            def __getitem__(self, idx):
                return _ImageLabel(decode)(super().__getitem__(idx))

        streaming.base.util.clean_stale_shared_memory()
        return torch.utils.data.DataLoader(MDSImages(local=spec["path"], shuffle=True, batch_size=bs),
                                           batch_size=bs, num_workers=par)
    raise ValueError(source)


def train_peer(spec: dict[str, Any]) -> Iterable:
    """The training section's peers, each its own fastest way to RandomResizedCrop(224) + flip."""
    import torch

    source, par, bs, size = spec["source"], spec["parallel"], spec["batch_size"], 224
    count = (spec["steps"] + 2) * bs
    order = (np.random.default_rng(0).permutation(len(spec["files"])).tolist() * (count // len(spec["files"]) + 1))
    order = order[:count]
    if source == "webdataset":
        import webdataset as wds

        ds = (wds.WebDataset(spec["path"], shardshuffle=len(spec["path"]), empty_check=False).shuffle(1000)
              .to_tuple("jpg", "cls").map_tuple(pipeline("train"), int))
        return torch.utils.data.DataLoader(ds.repeat(), batch_size=bs, num_workers=par)
    if source == "spdl":
        import spdl.io as sio
        from spdl.pipeline import PipelineBuilder

        from packer.codecs.image import to_chw
        from packer.data.video import random_resized_crop_box

        paths, labels, local = spec["files"], spec["labels"], threading.local()

        def load(i: int):
            rng = getattr(local, "rng", None)
            if rng is None:
                rng = local.rng = np.random.RandomState(threading.get_ident() % (2**32))
            packets = sio.demux_image(paths[i])
            top, left, h, w = random_resized_crop_box(packets.height, packets.width, rng)
            flip = ",hflip" if rng.rand() < 0.5 else ""
            desc = f"crop={w}:{h}:{left}:{top},scale={size}:{size}:flags=bilinear{flip},format=rgb24"
            arr = sio.to_numpy(sio.convert_frames(sio.decode_packets(packets, filter_desc=desc)))
            return to_chw(arr.reshape(size, size, 3)), labels[i]

        def collate(items):
            return torch.from_numpy(np.stack([a for a, _ in items])), torch.tensor([lab for _, lab in items])

        spdl_pipe = (PipelineBuilder().add_source(order).pipe(load, concurrency=par).aggregate(bs).pipe(collate)
                     .add_sink(3).build(num_threads=par))

        def run():
            with spdl_pipe.auto_stop():
                yield from spdl_pipe.get_iterator(timeout=120)
        return run()
    if source == "dali":
        from nvidia.dali import fn, pipeline_def, types

        @pipeline_def(batch_size=bs, num_threads=par, device_id=None, prefetch_queue_depth=2, seed=0)
        def pipe():
            jpegs, labels = fn.readers.file(file_root=spec["images"], random_shuffle=True, name="files")
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                   random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                                   num_attempts=10)
            images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR,
                               antialias=False)
            images = fn.flip(images, horizontal=fn.random.coin_flip(probability=0.5))
            return fn.transpose(images, perm=[2, 0, 1]), labels

        p = pipe()
        p.build()

        def run():
            for _ in range(count // bs):
                images, labels = p.run()
                yield torch.from_numpy(images.as_array()), torch.from_numpy(labels.as_array())
        return run()
    if source == "ffcv":
        from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
        from ffcv.loader import Loader as FfcvLoader
        from ffcv.loader import OrderOption
        from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage

        return FfcvLoader(spec["path"], batch_size=bs, num_workers=par, order=OrderOption.RANDOM, drop_last=True,
                          pipelines={"image": [RandomResizedCropRGBImageDecoder((size, size)), RandomHorizontalFlip(),
                                               ToTensor(), ToTorchImage(channels_last=False)],
                                     "label": [IntDecoder(), ToTensor()]})
    raise ValueError(source)


def main_and_all(pids: list[int]) -> tuple[dict[str, float], dict[str, float]]:
    """``proc_usage`` of the main process ``pids[0]`` and of all ``pids`` from one reading of each
    process, so the main process's share never exceeds the whole (two readings would count the
    faults of the first reading in the second)."""
    main, rest = proc_usage(pids[:1]), proc_usage(pids[1:])
    return main, {k: main[k] + rest[k] for k in main}


def child_loader(spec: dict[str, Any]) -> dict[str, Any]:
    """Time one row: the first batch (start-up) apart, then ``steps`` batches."""
    if spec.get("tuned"):
        from packer.heap import tune_heap

        tune_heap()
    t0 = time.perf_counter()
    it = iter(make_loader(spec))
    next(it)
    first = time.perf_counter() - t0
    pids = [os.getpid()] + descendants(os.getpid())  # the loader's workers, however it keeps them
    touch = spec.get("touch", False)
    main_before, before = main_and_all(pids)
    start, n = time.perf_counter(), 0
    for _ in range(spec["steps"]):
        batch = next(it, None)
        if batch is None:
            break
        if touch:
            touch_pages(batch)
        n += len(batch[1])
    wall = time.perf_counter() - start
    main_after, after = main_and_all(pids)
    window, main = usage_delta(before, after), usage_delta(main_before, main_after)
    close = getattr(it, "close", None)
    if close is not None:
        close()
    return {"samples": n, "samples_per_s": n / wall, "first_batch_s": first, "window_s": wall, "window": window,
            "window_main": main}


def child_cpu_limit(spec: dict[str, Any]) -> dict[str, Any]:
    """The CPU limit as a row: the row's images as encoded bytes in memory, each batch decoded by
    the bare loop body (``cpu_limits``) into one reused batch buffer, its images split over
    ``parallel`` threads (simplejpeg and OpenCV release the GIL): no dataset, loader, collate or
    tensor. Timed like ``child_loader``: the first batch apart, then ``steps`` batches."""
    from concurrent.futures import ThreadPoolExecutor

    body = cpu_limits()[spec["pipeline"]]
    bs, par, steps, files = spec["batch_size"], spec["parallel"], spec["steps"], spec["files"]
    order = np.random.default_rng(0).permutation(len(files)).tolist()
    blobs = [Path(files[order[i % len(files)]]).read_bytes() for i in range((steps + 1) * bs)]
    out = np.empty((bs, 224, 224, 3), np.uint8)
    rngs = [np.random.default_rng([0, k]) for k in range(par)]
    parts = [(bs * k // par, bs * (k + 1) // par, rngs[k]) for k in range(par)]

    def work(b: int, lo: int, hi: int, rng: np.random.Generator) -> None:
        for j in range(lo, hi):
            body(blobs[b * bs + j], rng, out[j])

    with ThreadPoolExecutor(par) as pool:
        def batch(b: int) -> None:
            list(pool.map(lambda part: work(b, *part), parts))

        t0 = time.perf_counter()
        batch(0)
        first = time.perf_counter() - t0
        before, start = proc_usage([os.getpid()]), time.perf_counter()
        for b in range(1, steps + 1):
            batch(b)
        wall = time.perf_counter() - start
        window = usage_delta(before, proc_usage([os.getpid()]))
    return {"samples": steps * bs, "samples_per_s": steps * bs / wall, "first_batch_s": first, "window_s": wall,
            "window": window, "window_main": window}


def child_item_cost(spec: dict[str, Any]) -> dict[str, Any]:
    """CPU us per ``dataset[i]`` (read, CRC check, the row pipeline's decode) of each pack in this
    process, the median of 5 passes over ``n`` samples in random order (a median, as the rows it
    is set against are medians over their rounds): what a loader adds nothing to."""
    from packer import PackedDataset

    out = {}
    for name, path in spec["paths"].items():
        ds = PackedDataset(path, decode=pipeline(spec["pipeline"]))
        n = min(spec["n"], len(ds))
        order = np.random.default_rng(1).permutation(len(ds))[:n].tolist()
        for i in order[:16]:
            ds[i]
        passes = []
        for _ in range(5):
            t = time.process_time()
            for i in order:
                ds[i]
            passes.append((time.process_time() - t) / n)
        out[name] = 1e6 * statistics.median(passes)
    return {"samples": spec["n"], "item_us": out}


def child_stream(spec: dict[str, Any]) -> dict[str, Any]:
    """One full epoch of ``StreamingDataset(decode="bytes")`` in this process: samples/s."""
    from packer import StreamingDataset

    ds = StreamingDataset(spec["path"], decode="bytes", **spec.get("dataset_options", {}))
    before, start, n = proc_usage([os.getpid()]), time.perf_counter(), 0
    for _ in ds:
        n += 1
    wall = time.perf_counter() - start
    return {"samples": n, "samples_per_s": n / wall, "window_s": wall,
            "window": usage_delta(before, proc_usage([os.getpid()]))}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration of any section in this (fresh) process."""
    kind = spec.get("kind", "loader")
    if kind == "loader":
        return child_loader(spec)
    if kind == "stream":
        return child_stream(spec)
    if kind == "cpu-limit":
        return child_cpu_limit(spec)
    if kind == "item-cost":
        return child_item_cost(spec)
    if kind == "costs":
        return child_costs(spec)
    if kind == "probe":
        return child_probe(spec)
    if kind == "build":
        return child_build(spec)
    if kind == "packer-bench":
        return child_packer_bench(spec)
    raise ValueError(kind)


# == running rows (parent) ==============================================================================
def run_rows(rows: list[dict[str, Any]], repeats: int, label: Callable[[dict], str]) -> list[dict[str, Any]]:
    """Each row in a fresh process, rounds interleaved (a load spike spreads over all rows); every
    round's result is kept (``rounds``) and the best by samples/s summarised."""
    out: dict[int, dict[str, Any]] = {}
    for rnd in range(repeats):
        shift = rnd % len(rows) if rows else 0
        for i in [*range(shift, len(rows)), *range(shift)]:  # rotating: no row always runs first
            spec = rows[i]
            r = run_fresh(MODULE, spec, cwd=spec.get("tree"), python=spec.get("python"))
            entry = out.setdefault(i, {"row": {k: v for k, v in spec.items() if k not in ("files", "labels")},
                                       "rounds": []})
            entry["rounds"].append(r)
            rate = r.get("samples_per_s")
            load = os.getloadavg()[0]
            msg = f"{rate:7.0f} samples/s" if rate else r.get("error", "?")
            print(f"[{rnd}] {label(spec):>44}: {msg} (load {load:.1f})", file=sys.stderr, flush=True)
    results = []
    for i in sorted(out):
        entry = out[i]
        ok = [r for r in entry["rounds"] if "samples_per_s" in r]
        if ok:
            best = max(ok, key=lambda r: r["samples_per_s"])
            entry.update(best=best, samples_per_s=best["samples_per_s"], **per_sample(best))
        else:
            entry["error"] = entry["rounds"][-1].get("error")
        results.append(entry)
    return results


def per_sample(r: dict[str, Any]) -> dict[str, float]:
    """CPU ms and minor faults per sample in the timed window, and system time as a share of user."""
    n, w = max(r["samples"], 1), r["window"]
    return {"user_ms": 1e3 * w["user_s"] / n, "sys_ms": 1e3 * w["sys_s"] / n, "minflt": w["minflt"] / n,
            "sys_share": w["sys_s"] / w["user_s"] if w["user_s"] > 0 else float("nan")}


def _f(x: float | None, fmt: str = ".0f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def targets_md(targets: list[dict[str, Any]]) -> str:
    rows = [[t["name"] + (f" ({t['who']})" if t["who"] else ""),
             _f(t["value"], ".2f") + ("x" if t["value"] is not None else ""),
             "" if t["target"] is None else ("<= " if t["at_most"] else ">= ") + f"{t['target']}x",
             {True: "met", False: "**missed**", None: "n/a"}[t["met"]]] for t in targets]
    return md_table(["target", "measured", "goal", ""], rows)


def rows_md(results: list[dict[str, Any]], ratio_to: Callable[[dict], dict | None],
            cols: tuple[str, ...] = ("source", "pipeline", "loader")) -> str:
    """The common table: throughput, ratio, CPU and faults per sample in the window, whole process."""
    table = []
    for e in results:
        row = e["row"]
        head = [row.get(c, "") for c in cols] + [f"{row['loader']} {row['parallel']}" if "loader" not in cols
                                                   else row["parallel"]]
        if "error" in e:
            table.append(head + [f"failed: {e['error']}"] + [""] * 9)
            continue
        ref = ratio_to(e)
        ratio = e["samples_per_s"] / ref["samples_per_s"] if ref and "samples_per_s" in ref else None
        p = e["best"]["process"]
        cpu, ref_cpu = per_cpu_s(e), per_cpu_s(ref)
        cpu_ratio = cpu / ref_cpu if cpu and ref_cpu else None
        table.append(head + [_f(e["samples_per_s"]), _f(ratio, ".2f") + ("x" if ratio else ""), _f(cpu),
                             _f(cpu_ratio, ".2f") + ("x" if cpu_ratio else ""), _f(e["user_ms"], ".2f"), _f(e["sys_ms"], ".2f"), _f(e["minflt"], ".0f"),
                             f"{p['wall_s']:.1f}", f"{p['user_s'] + p['sys_s']:.1f}", f"{p['minflt'] / 1e3:.0f}k"])
    columns = [c for c in cols] + ["threads/workers" if "loader" in cols else "loader",
                                   "samples/s", "/ ref", "img/CPU-s", "/ ref", "user ms/img", "sys ms/img", "faults/img",
                                   "process wall s", "process CPU s", "process faults"]
    return md_table(columns, table)


def find(results: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for e in results:
        if all(e["row"].get(k) == v for k, v in match.items()) and "samples_per_s" in e:
            return e
    return None


# == sections ===========================================================================================
def base_spec(args: argparse.Namespace, items: list[Any]) -> dict[str, Any]:
    return {"batch_size": args.batch_size, "steps": args.steps,
            "files": [str(it.path) for it in items], "labels": [int(it.label) for it in items]}


def section_loaders(args: argparse.Namespace, work: Path, skipped: dict[str, str]) -> dict[str, Any]:
    from packer.conversion.inputs import image_folder as list_folder
    from packer.formats import FORMATS

    src = image_folder(work / f"images-{args.count}", count=args.count, classes=args.classes)
    items, _ = list_folder(src)
    formats = [f for f in args.formats if f in FORMATS]
    paths = {f: packed(src, work / f"packed-{args.count}" / f"data.{f}", f, workers=2) for f in formats}
    peers, env = peer_env(args.peer_python, args.peers, skipped)
    peer_paths = {}
    for p in peers:
        try:
            peer_paths[p] = built_peer(p, items, work / f"peers-{args.count}", args.peer_python)
        except Exception as e:  # a peer that cannot run here is reported, never faked
            skipped[p] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    base = base_spec(args, items)
    rows: list[dict[str, Any]] = []
    sources = ["ceiling", "folder"] + [f"packer/{f}" for f in formats] + list(peer_paths)
    for source in sources:
        path = paths.get(source.split("/", 1)[-1]) if source.startswith("packer/") else peer_paths.get(source)
        for pipe in ("packer", "pillow"):
            for w in args.workers:
                rows.append(dict(base, source=source, pipeline=pipe, loader="DataLoader", parallel=w, path=path,
                                 **({"python": args.peer_python} if source in PEERS else {})))
            if source in PEERS:
                continue
            for t in args.threads if pipe == "packer" else ():
                rows.append(dict(base, source=source, pipeline=pipe, loader="Loader", parallel=t, path=path))
    top_w, top_t = max(args.workers), max(args.threads)
    for loader, par in (("Loader", top_t), ("DataLoader", top_w)):
        rows.append(dict(base, source="packer/lmdb", pipeline="packer", loader=loader, parallel=par,
                         path=paths["lmdb"], tuned=True))
    if "lmdb" in paths:  # the least a checked LMDB read does, no packer reader: the bound packer/lmdb is held to
        rows.append(dict(base, source="floor/lmdb", pipeline="packer", loader="DataLoader", parallel=top_w,
                         path=paths["lmdb"]))
    if peer_paths and args.peer_python:  # packer's default in the peers' interpreter: what its torch changes
        rows.append(dict(base, source="packer/lmdb", pipeline="packer", loader="DataLoader", parallel=top_w,
                         path=paths["lmdb"], python=args.peer_python, peer_env=True))
    results = run_rows(rows, args.repeats,
                       lambda s: f"{s['source']} {s['pipeline']} {s['loader']} {s['parallel']}"
                                 + (" tuned" if s.get("tuned") else "") + (" peers' env" if s.get("peer_env") else ""))
    for e in results:
        if e["row"].get("tuned"):
            e["row"]["pipeline"] += " (tuned heap)"
        if e["row"].get("peer_env"):
            e["row"]["pipeline"] += " (peers' env)"

    mean_kb = sum(Path(f).stat().st_size for f in base["files"]) / len(base["files"]) / 1e3
    params = {"count": args.count, "classes": args.classes, "batch_size": args.batch_size, "steps": args.steps,
              "repeats": args.repeats, "workers": args.workers, "threads": args.threads, "mean_jpeg_kb": mean_kb,
              "formats": formats, "peers": list(peer_paths), "peer_env": env,
              "torch": torch_version()}
    return dict(summarize_loaders(results, params), params=params, results=results)


def torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def env_line(params: dict[str, Any]) -> str:
    """Which interpreters ran the rows: packer's, and the peers' when that is another one."""
    env = params.get("peer_env") or {}
    if not params.get("peers"):
        return ""
    versions = ", ".join(f"{k} {v}" for k, v in sorted((env.get("versions") or {}).items()))
    if env.get("python") in (None, sys.executable):
        return f" Peers ({versions}) in the same interpreter as packer (torch {params.get('torch')})."
    return (f" packer's rows ran in packer's environment (torch {params.get('torch')}); the peers' rows, their "
            f"writers and the row marked (peers' env) in the peers' own virtual environment `{env['python']}` "
            f"(torch {env.get('torch')}; {versions}).")


def per_cpu_s(e: dict[str, Any] | None) -> float | None:
    """Samples per CPU-second of a row's timed window (process, threads and workers): the
    figure other jobs on a shared machine hardly move."""
    if not e or "samples_per_s" not in e:
        return None
    w = e["best"]["window"]
    return e["best"]["samples"] / (w["user_s"] + w["sys_s"]) if w["user_s"] + w["sys_s"] > 0 else None


def _cpu_rate(r: dict[str, Any]) -> float | None:
    w = r.get("window") or {}
    cpu = w.get("user_s", 0.0) + w.get("sys_s", 0.0)
    return r["samples"] / cpu if "samples_per_s" in r and cpu > 0 else None


def median_cpu_us(e: dict[str, Any] | None) -> float | None:
    """A row's CPU us per sample in its timed window, the median over its rounds."""
    rates = [r for r in (_cpu_rate(x) for x in (e or {}).get("rounds", [])) if r]
    return 1e6 / statistics.median(rates) if rates else None


def round_ratios(a: dict[str, Any] | None, b: dict[str, Any] | None, *, per_cpu: bool) -> list[float]:
    """Row ``a`` over row ``b`` within each round (rounds are interleaved, so a round's two rows ran
    minutes apart at most: a change of the machine's load hits both), samples/s or samples per
    CPU-second."""
    if not a or not b:
        return []
    out = []
    for ra, rb in zip(a.get("rounds", []), b.get("rounds", [])):
        x, y = ((_cpu_rate(ra), _cpu_rate(rb)) if per_cpu else (ra.get("samples_per_s"), rb.get("samples_per_s")))
        if x and y:
            out.append(x / y)
    return out


def summarize_loaders(results: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    """The loaders section's targets and markdown from its rows: wall-clock ratios, and the same
    ratios in samples per CPU-second (what stands when the machine is shared)."""
    top_w, top_t = max(params["workers"]), max(params["threads"])

    def ceiling(e: dict[str, Any]) -> dict[str, Any] | None:
        return find(results, source="ceiling", pipeline=e["row"]["pipeline"].split(" ")[0],
                    loader=e["row"]["loader"], parallel=e["row"]["parallel"])

    ratios: dict[str, dict[str, Any]] = {}

    def both(name: str, a: dict | None, b: dict | None, goal: float, who: str = "") -> list[dict[str, Any]]:
        """Wall and per-CPU-second ratio of rows ``a`` and ``b``: the median of the rounds' ratios
        (each round's two rows ran close in time), the range kept in ``ratios``."""
        out = []
        for key, per_cpu in ((name, False), (name + ", per CPU-second", True)):
            r = round_ratios(a, b, per_cpu=per_cpu)
            ratios[key] = {"rounds": r, "median": statistics.median(r) if r else None,
                           "least": min(r) if r else None, "most": max(r) if r else None}
            out.append(target(key, ratios[key]["median"], goal, who))
        return out

    targets: list[dict[str, Any]] = []
    folder = find(results, source="folder", pipeline="packer", loader="DataLoader", parallel=top_w)
    floor = find(results, source="floor/lmdb", pipeline="packer", loader="DataLoader", parallel=top_w)
    for f in params["formats"]:
        e = find(results, source=f"packer/{f}", pipeline="packer", loader="DataLoader", parallel=top_w)
        if f == "lmdb" and floor:
            # the ceiling holds no file: what a checked LMDB read costs at the least (the floor, measured
            # beside it) is the reason packer/lmdb stays under it; the target is the floor
            targets += both(f"packer/{f} vs in-memory ceiling, DataLoader {top_w} workers", e, e and ceiling(e), None)
            targets += both(f"the LMDB floor (py-lmdb get + CRC32C + Datum parse, no packer reader) vs in-memory "
                            f"ceiling, DataLoader {top_w} workers", floor, ceiling(floor), None)
            targets += both(f"packer/{f} vs the LMDB floor, DataLoader {top_w} workers", e, floor, 0.95)
        else:
            targets += both(f"packer/{f} vs in-memory ceiling, DataLoader {top_w} workers", e, e and ceiling(e), 0.95)
        targets += both(f"packer/{f} vs the folder read file by file (same decode), DataLoader {top_w} workers",
                        e, folder, 1.0)
    peer_default = [find(results, source=p, pipeline="pillow", loader="DataLoader", parallel=top_w)
                    for p in params["peers"]]
    peer_default = [p for p in peer_default if p]
    fastest = max(peer_default, key=lambda e: e["samples_per_s"]) if peer_default else None
    for loader, par in (("Loader", top_t), ("DataLoader", top_w)):
        mine = find(results, source="packer/lmdb", pipeline="packer", loader=loader, parallel=par)
        tuned = find(results, source="packer/lmdb", pipeline="packer (tuned heap)", loader=loader, parallel=par)
        targets += both(f"default {loader} {par} vs the fastest peer's default at {top_w} workers", mine, fastest, 2.0,
                        fastest["row"]["source"] if fastest else "no peer installed")
        targets += both(f"default {loader} {par} vs the same with the heap tuned by hand", mine, tuned, 0.9)
        targets.append(target(f"default {loader} {par}: system time / user time",
                              mine and mine["sys_share"], 0.10, at_most=True))
    p = params
    head = (f"{p['count']} photo-like JPEGs (packer.synth, ~432x576 +-1/8, mean {p['mean_jpeg_kb']:.0f} kB) in "
            f"{p['classes']} classes; Resize(256) + CenterCrop(224) to uint8 CHW; batch {p['batch_size']}; "
            f"{p['steps']} batches timed after the first; best of {p['repeats']} interleaved rounds; "
            f"each row a fresh process with default settings. img/CPU-s, CPU and faults per image: the timed "
            f"window (process, threads and workers); process columns: the child's whole life (start-up "
            f"included)." + env_line(p))
    head += (" Each ratio below is the median of the rounds' ratios (the two rows of a round ran close in time), "
             "its range in the ratios table.")
    spread = md_table(["ratio", "median of rounds", "range"],
                      [[k, f"{v['median']:.2f}x", f"{v['least']:.2f}-{v['most']:.2f}"]
                       for k, v in ratios.items() if v["median"] is not None])
    return {"targets": targets, "ratios": ratios,
            "markdown": "\n\n".join([head, rows_md(results, ceiling), targets_md(targets), spread])}


def section_training(args: argparse.Namespace, work: Path, skipped: dict[str, str]) -> dict[str, Any]:
    from packer.codecs.resize import ResizeSpec
    from packer.conversion.inputs import image_folder as list_folder

    src = image_folder(work / f"images-{args.count}", count=args.count, classes=args.classes)
    items, _ = list_folder(src)
    packs = {"packer/lmdb": packed(src, work / f"packed-{args.count}" / "data.lmdb", "lmdb", workers=2)}
    if "hdf5" in args.formats:
        packs["packer/hdf5"] = packed(src, work / f"packed-{args.count}" / "data.hdf5", "hdf5", workers=2)
        packs["packer/hdf5-raw"] = packed(src, work / f"packed-{args.count}" / "raw-256x320.h5", "hdf5", workers=2,
                                          raw=True, resize=ResizeSpec(size=(320, 256)))
    peers, env = peer_env(args.peer_python, args.train_peers, skipped)
    base = dict(base_spec(args, items), pipeline="train", images=str(src))
    par = max(args.threads)
    rows = []
    for source, path in packs.items():
        for loader in ("Loader", "DataLoader"):
            rows.append(dict(base, source=source, loader=loader, parallel=par, path=path))
    for p in peers:
        try:
            path = (built_peer(p, items, work / f"peers-{args.count}", args.peer_python) if p in ("webdataset", "ffcv")
                    else None)  # SPDL and DALI read the JPEG files
        except Exception as e:  # a peer that cannot run here is reported, never faked
            skipped[p] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            continue
        rows.append(dict(base, source=p, loader=p, parallel=par, path=path, python=args.peer_python))
    if peers and args.peer_python:  # packer's default in the peers' interpreter: what its torch changes
        rows.append(dict(base, source="packer/lmdb", loader="Loader", parallel=par, path=packs["packer/lmdb"],
                         python=args.peer_python, peer_env=True))
    if cpu_limits():
        rows.append(dict(base, source="cpu-limit", loader="bare loop", parallel=par, kind="cpu-limit"))
    else:
        skipped["cpu-limit"] = "simplejpeg is not installed (the turbo extra)"
    results = run_rows(rows, args.repeats, lambda s: f"train {s['source']} {s['loader']} {s['parallel']}"
                                                     + (" peers' env" if s.get("peer_env") else ""))
    for e in results:
        if e["row"].get("peer_env"):
            e["row"]["pipeline"] += " (peers' env)"
    parts = run_fresh(MODULE, {"kind": "item-cost", "paths": {k: v for k, v in packs.items() if k != "packer/hdf5"},
                               "pipeline": "train", "n": min(400, args.count)})

    params = {"parallel": par, "count": args.count, "peer_env": env, "batch_size": args.batch_size,
              "steps": args.steps, "peers": peers, "torch": torch_version()}
    return dict(summarize_training(results, parts, params), params=params, results=results)


def summarize_training(results: list[dict[str, Any]], parts: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The training section's targets and markdown from its rows and the dataset[i] costs
    (``parts``, the ``item-cost`` child's result)."""
    def lmdb_loader(e: dict[str, Any]) -> dict[str, Any] | None:
        return ours

    ours = find(results, source="packer/lmdb", loader="Loader", pipeline="train")  # not the (peers' env) row
    others = [e for e in results if not e["row"]["source"].startswith(("packer/", "cpu-limit"))
              and "samples_per_s" in e]
    fastest = max(others, key=lambda e: e["samples_per_s"]) if others else None
    fastest_cpu = max(others, key=lambda e: per_cpu_s(e) or 0.0) if others else None
    limit = find(results, source="cpu-limit")
    lm_dl = find(results, source="packer/lmdb", loader="DataLoader")
    raw_l = find(results, source="packer/hdf5-raw", loader="Loader")
    raw_dl = find(results, source="packer/hdf5-raw", loader="DataLoader")
    item_us = parts.get("item_us", {})
    par = params["parallel"]
    t: list[dict[str, Any]] = []

    table: list[list[str]] = []
    ranges: dict[str, dict[str, Any]] = {}

    def pair(name: str, a: dict | None, b: dict | None, wall_goal: float | None, cpu_goal: float | None,
             who: str = "", cpu_b: dict | None = None) -> None:
        """Wall and per-CPU-second ratio of rows ``a`` and ``b`` (``cpu_b``: another ``b`` for the CPU
        ratio), each the median of the rounds' ratios; the range goes into the table."""
        wall, cpu = round_ratios(a, b, per_cpu=False), round_ratios(a, cpu_b or b, per_cpu=True)
        who_cpu = (cpu_b or b or {}).get("row", {}).get("source", "") if who else ""
        if wall_goal is not None:
            t.append(target(name, statistics.median(wall) if wall else None, wall_goal, who))
        t.append(target(name + ", per CPU-second", statistics.median(cpu) if cpu else None, cpu_goal, who_cpu))
        ranges[name] = {"wall": wall, "per_cpu": cpu}
        table.append([name + (f" ({who} / {who_cpu})" if who else ""),
                      f"{statistics.median(wall):.2f}x ({min(wall):.2f}-{max(wall):.2f})" if wall else "n/a",
                      f"{statistics.median(cpu):.2f}x ({min(cpu):.2f}-{max(cpu):.2f})" if cpu else "n/a"])

    def bound(name: str, a_item: str, b_per_img_us: float | None, goal: float = 0.9) -> None:
        """What a loader costing nothing would reach (``b``'s CPU per image over ``a``'s dataset[i]
        alone, measured in one process), and the measured per-CPU ratio as a share of it."""
        value = next((x["value"] for x in t if x["name"] == name + ", per CPU-second"), None)
        lim = b_per_img_us / item_us[a_item] if b_per_img_us and item_us.get(a_item) else None
        t.append(target(f"{name}, bound for a loader costing nothing, per CPU-second", lim, None))
        t.append(target(f"{name}, per CPU-second, share of that bound", value / lim if value and lim else None, goal))

    who = fastest["row"]["source"] if fastest else "no peer installed"
    pair("packer default training pipeline vs the fastest peer", ours, fastest, 1.2, 1.5, who, fastest_cpu)
    for name, e in (("Loader", ours), ("DataLoader", lm_dl)):
        pair(f"packer/lmdb {name} vs the CPU limit (bare decode-crop loop)", e, limit, None, 0.9)
    pair("Loader vs DataLoader, LMDB-JPEG", ours, lm_dl, None, None)
    bound("Loader vs DataLoader, LMDB-JPEG", "packer/lmdb", median_cpu_us(lm_dl))
    pair("Loader vs DataLoader, raw HDF5 pixels", raw_l, raw_dl, None, None)
    bound("Loader vs DataLoader, raw HDF5 pixels", "packer/hdf5-raw", median_cpu_us(raw_dl))
    pair("raw HDF5 vs LMDB-JPEG end to end, Loader", raw_l, ours, None, None)
    bound("raw HDF5 vs LMDB-JPEG end to end, Loader", "packer/hdf5-raw", item_us.get("packer/lmdb"))
    parts_md = ("dataset[i] alone (read, CRC check, decode-crop), CPU per sample in one fresh process, median of 5 "
                "passes over " + str(parts.get("samples")) + " samples: "
                + ", ".join(f"{k} {v:.0f} us" for k, v in item_us.items()) if item_us else
                f"dataset[i] cost failed: {parts.get('error')}")
    head = (f"RandomResizedCrop(224) + flip (packer: DecodeRandomResizedCrop; raw rows: 256x320 pixels), "
            f"batch {params.get('batch_size', 64)}, {par} threads or workers per row, every peer its own fastest "
            f"way; {params.get('steps', 20)} batches timed; each row a fresh process. Ratio column: to packer/lmdb "
            "Loader. The ratios table: each the median of the rounds' ratios (the rows of a round ran close in "
            "time) and their range." + env_line(params))
    return {"targets": t, "item_us": item_us, "ratios": ranges,
            "markdown": "\n\n".join([head, rows_md(results, lmdb_loader),
                                      md_table(["ratio", "wall, median of rounds (range)",
                                                "per CPU-second, median of rounds (range)"], table),
                                      parts_md, targets_md(t)])}


def section_formats(args: argparse.Namespace, work: Path, skipped: dict[str, str]) -> dict[str, Any]:
    from packer.conversion.inputs import image_folder as list_folder
    from packer.formats import FORMATS

    src = image_folder(work / f"images-{args.count}", count=args.count, classes=args.classes)
    items, _ = list_folder(src)
    paths = {f: packed(src, work / f"packed-{args.count}" / f"data.{f}", f, workers=2)
             for f in args.formats if f in FORMATS}
    base = dict(base_spec(args, items), pipeline="tensor")
    rows = [dict(base, source="ceiling", loader="DataLoader", parallel=w) for w in args.workers]
    for w in args.workers:
        for f, path in paths.items():
            rows.append(dict(base, source=f"packer/{f}", loader="DataLoader", parallel=w, path=path))
        if "records" in paths:
            rows.append(dict(base, source="packer/records-nocrc", loader="DataLoader", parallel=w,
                             path=paths["records"], dataset_options={"check_crc": False}))
            rows.append(dict(base, source="stream/records", loader="DataLoader", parallel=w, path=paths["records"]))
    results = run_rows(rows, args.repeats, lambda s: f"tensor {s['source']} w={s['parallel']}")

    def ceiling(e: dict[str, Any]) -> dict[str, Any] | None:
        return find(results, source="ceiling", parallel=e["row"]["parallel"])

    t = [target(f"{e['row']['source']} vs ceiling, {e['row']['parallel']} workers",
                e["samples_per_s"] / ceiling(e)["samples_per_s"] if ceiling(e) and "samples_per_s" in e else None,
                0.95) for e in results if e["row"]["source"] != "ceiling" and e["row"]["parallel"] == max(args.workers)]
    head = (f"Full decode to a CHW tensor (decode=\"tensor\") + a fixed {CROP[0]}x{CROP[1]} centre crop, "
            f"default collate, batch {args.batch_size}; each row a fresh process.")
    return {"params": {"count": args.count}, "results": results, "targets": t,
            "markdown": "\n\n".join([head, rows_md(results, ceiling, ("source", "pipeline")), targets_md(t)])}


def section_raw(args: argparse.Namespace, work: Path, skipped: dict[str, str]) -> dict[str, Any]:
    from packer.codecs.resize import ResizeSpec
    from packer.conversion.inputs import image_folder as list_folder

    src = image_folder(work / f"images-{args.count}", count=args.count, classes=args.classes)
    items, _ = list_folder(src)
    spec = ResizeSpec(size=(224, 224))
    outs = {"packer/lmdb-jpeg224": packed(src, work / f"packed-{args.count}" / "jpeg224.lmdb", "lmdb", workers=2,
                                          resize=spec),
            "packer/hdf5-jpeg224": packed(src, work / f"packed-{args.count}" / "jpeg224.h5", "hdf5", workers=2,
                                          resize=spec),
            "packer/hdf5-raw224": packed(src, work / f"packed-{args.count}" / "raw224.h5", "hdf5", workers=2,
                                         resize=spec, raw=True)}
    # the least a checked raw read does, no packer reader (RawFloor): how far raw pixels can get ahead
    outs["floor/hdf5-raw224"] = outs["packer/hdf5-raw224"]
    # a raw sample costs ~50 µs: time the whole pack (not --steps' 20 batches, a ~0.1 s window) and
    # take each ratio within a round, the median of at least 5 rounds
    steps = max(args.steps, args.count // args.batch_size - 2)
    repeats = args.repeats if args.quick else max(args.repeats, 5)
    base = dict(base_spec(args, items), pipeline="tensor", crop=False, steps=steps)
    rows = [dict(base, source=s, loader="DataLoader", parallel=w, path=p) for w in args.workers
            for s, p in outs.items()]
    results = run_rows(rows, repeats, lambda s: f"raw {s['source']} w={s['parallel']}")

    def lmdb(e: dict[str, Any]) -> dict[str, Any] | None:
        return find(results, source="packer/lmdb-jpeg224", parallel=e["row"]["parallel"])

    def rate(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
        r = round_ratios(a, b, per_cpu=False)
        return statistics.median(r) if r else None

    t = []
    for w in args.workers:
        raw = find(results, source="packer/hdf5-raw224", parallel=w)
        floor = find(results, source="floor/hdf5-raw224", parallel=w)
        for s in ("packer/lmdb-jpeg224", "packer/hdf5-jpeg224"):
            other = find(results, source=s, parallel=w)
            t.append(target(f"HDF5 raw vs {s.split('/')[1]}, {w} workers", rate(raw, other)))
        # a raw reader costing nothing beyond its read, CRC32C and copy could be this far ahead at most:
        # the bound that replaced the 5x goal (docs/resize-and-hdf5.md)
        t.append(target(f"HDF5 raw vs lmdb-jpeg224, {w} workers, bound for a raw reader costing nothing",
                        rate(floor, find(results, source="packer/lmdb-jpeg224", parallel=w))))
        t.append(target(f"HDF5 raw vs the raw floor (one pread + CRC32C + copy, no packer reader), {w} workers",
                        rate(raw, floor), 0.9))
    head = ("The same images packed at 224x224 (centre crop) three ways, read as uint8 CHW tensors "
            "(decode=\"tensor\", CRC checked), and the least a checked read of the raw file does with no packer "
            "reader (floor: one positioned read of the sample's chunk, its CRC32C, the copy into a CHW tensor); "
            f"each row a fresh process, {steps} batches timed after the first, {repeats} interleaved rounds (the "
            "table: each row's best; the targets: the median of the rounds' ratios). Ratio column: to LMDB-JPEG.")
    return {"params": {"count": args.count, "steps": steps, "repeats": repeats}, "results": results, "targets": t,
            "markdown": "\n\n".join([head, rows_md(results, lmdb, ("source",)), targets_md(t)])}


def _lmdb_floor(path: str, order: list[int]) -> Iterator[Any]:
    """``LmdbFloor``'s samples of ``order``, decoded like the loaders' rows (``DecodeResizeCrop(256, 224)``)."""
    floor = LmdbFloor(path, pipeline("packer"))
    return (floor[i] for i in order)


def child_costs(spec: dict[str, Any]) -> dict[str, Any]:
    """CPU us per sample of each part, in this process, least of 3 passes: fetching the bytes from
    each source (decode="bytes"), each decode on bytes in memory, the two CRC32Cs of a record;
    the whole ``dataset[i]`` of each source, least of 5 interleaved passes."""
    from packer import PackedDataset
    from packer.data.datasets import decode_record
    from packer.formats import open_reader
    from packer.integrity import masked_crc32c

    n = spec["n"]
    order = np.random.default_rng(1).permutation(len(spec["files"]))[:n].tolist()
    blobs = [Path(spec["files"][i]).read_bytes() for i in order]

    def least(make: Callable[[], Iterable], passes: int = 3) -> float:
        best = math.inf
        for _ in range(passes):
            it = iter(make())
            t = time.process_time()
            for _ in it:
                pass
            best = min(best, (time.process_time() - t) / n)
        return 1e6 * best

    decode = {name: least(lambda fn=pipeline(name): (fn(b) for b in blobs)) for name in ("packer", "pillow", "train")}
    decode["tensor"] = least(lambda: (decode_record(b, "tensor") for b in blobs))
    fetch = {"ceiling": least(lambda: (blobs[k] for k in range(n))),
             "folder": least(lambda: (Path(spec["files"][i]).read_bytes() for i in order))}
    for name, path in spec["paths"].items():
        ds = PackedDataset(path, decode="bytes")
        fetch[f"packer/{name}"] = least(lambda ds=ds: (ds[i] for i in order))
    # the whole dataset[i] the loaders' rows take (fetch, check, parse, decode + resize + crop):
    # what the DataLoader rows' gap to the ceiling is made of, in one process; passes interleaved
    # (a row timed after the others would see the process's caches and heap as they left them)
    ceiling = InMemory([spec["files"][i] for i in order], [0] * n, pipeline("packer"))
    items: dict[str, Callable[[], Iterable]] = {"ceiling": lambda: (ceiling[k] for k in range(n))}
    for name, path in spec["paths"].items():
        ds = PackedDataset(path, decode=pipeline("packer"))
        items[f"packer/{name}"] = lambda ds=ds: (ds[i] for i in order)
    if "lmdb" in spec["paths"]:  # the least any checked LMDB read does, without packer's reader
        items["lmdb floor (get, CRC32C, Datum parse)"] = lambda: _lmdb_floor(spec["paths"]["lmdb"], order)
    item = {name: math.inf for name in items}
    for _ in range(5):
        for name, make in items.items():
            item[name] = min(item[name], least(make, passes=1))
    out = {"samples": n, "decode_us": decode, "fetch_us": fetch, "item_us": item}
    if "records" in spec["paths"]:
        ds = PackedDataset(spec["paths"]["records"], decode="bytes", check_crc=False)
        fetch["packer/records-nocrc"] = least(lambda: (ds[i] for i in order))
        records = open_reader(spec["paths"]["records"])
        framed = [bytes(records.read_payload(i)) for i in order]
        lengths = [len(p).to_bytes(8, "little") for p in framed]
        out["crc_us"] = least(lambda: ((masked_crc32c(a), masked_crc32c(b)) for a, b in zip(lengths, framed)))
        out["crc_share"] = out["crc_us"] / (fetch["packer/records"] + decode["tensor"])
    return out


def section_costs(args: argparse.Namespace, work: Path, skipped: dict[str, str]) -> dict[str, Any]:
    from packer.conversion.inputs import image_folder as list_folder
    from packer.formats import FORMATS

    src = image_folder(work / f"images-{args.count}", count=args.count, classes=args.classes)
    items, _ = list_folder(src)
    paths = {f: packed(src, work / f"packed-{args.count}" / f"data.{f}", f, workers=2)
             for f in args.formats if f in FORMATS}
    n = min(400, args.count)
    r = run_fresh(MODULE, dict(base_spec(args, items), kind="costs", paths=paths, n=n))
    if "error" in r:
        return {"results": r, "markdown": f"costs failed: {r['error']}"}
    d = r["decode_us"]
    table = [[k, f"{v:.1f}", f"{1e6 / (v + d['packer']):.0f}", f"{1e6 / (v + d['pillow']):.0f}",
              f"{(r['fetch_us']['ceiling'] + d['packer']) / (v + d['packer']):.3f}x"]
             for k, v in r["fetch_us"].items()]
    md = "\n\n".join([
        f"CPU per sample in one fresh process, least of 3 passes over {n} samples in random order. Decode + "
        f"resize 256 + crop 224: packer {d['packer']:.0f} us, Pillow {d['pillow']:.0f} us "
        f"({d['pillow'] / d['packer']:.2f}x); RandomResizedCrop(224) + flip {d.get('train', float('nan')):.0f} us; "
        f"full decode to a tensor {d['tensor']:.0f} us."
        + (f" The two CRC32Cs of a checked record: {r['crc_us']:.1f} us = {100 * r['crc_share']:.2f}% of a "
           f"records read + full decode." if "crc_us" in r else ""),
        md_table(["source", "fetch us", "img/CPU-s, packer decode", "img/CPU-s, Pillow", "vs ceiling (packer)"],
                 table),
        "The whole `dataset[i]` of the loaders' rows (`DecodeResizeCrop(256, 224)`), least of 5 passes taken in turn:",
        md_table(["source", "item us", "vs ceiling"],
                 [[k, f"{v:.1f}", f"{r['item_us']['ceiling'] / v:.3f}x"] for k, v in r["item_us"].items()])])
    return {"params": {"samples": n}, "results": r, "markdown": md}


def sorted_pack(args: argparse.Namespace, work: Path, fmt: str) -> Path:
    """The shuffle section's class-sorted images (``--shuffle-classes`` x ``--shuffle-per-class``
    32x32 JPEGs) packed as ``fmt`` (records in ``--shuffle-shard``-sample shards); made once."""
    from packer.commands.pack_images import pack_images
    from packer.conversion.options import RunOptions
    from packer.synth import jpeg_bytes, natural_image

    classes, per, shard = args.shuffle_classes, args.shuffle_per_class, args.shuffle_shard
    src = work / f"sorted-{classes}x{per}"
    if not (src / ".complete").exists():
        shutil.rmtree(src, ignore_errors=True)
        rng = np.random.default_rng(0)
        blobs = [jpeg_bytes(natural_image(rng, 32, 32), 90) for _ in range(64)]
        for i in range(classes * per):  # class-sorted: class = i's block
            d = src / f"class_{i // per:04d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"img_{i:06d}.jpg").write_bytes(blobs[i % len(blobs)])
        (src / ".complete").write_text("ok")
    out = work / (f"sorted-{classes}x{per}-{shard}.records" if fmt == "records" else f"sorted-{classes}x{per}.{fmt}")
    if not (out / "manifest.json").exists():
        pack_images(src, out, format=fmt, check="header",
                    writer_options={"samples_per_shard": shard} if fmt == "records" else {},
                    run_options=RunOptions(workers=2, overwrite=True))
    return out


def section_shuffle(args: argparse.Namespace, work: Path, skipped: dict[str, str]) -> dict[str, Any]:
    from packer.data.mixing import mixing_report
    from packer.formats import open_reader
    from packer import StreamingDataset

    classes, per, shard = args.shuffle_classes, args.shuffle_per_class, args.shuffle_shard
    out = sorted_pack(args, work, "records")
    reader = open_reader(out)
    labels = np.array([reader.read(i).label for i in range(len(reader))])
    variants = {"previous (shard order + 4096 buffer)": {"block_size": None}, "default (block shuffle)": {}}
    rep = {name: mixing_report(labels[np.array(StreamingDataset(out, decode="bytes", **opts).order())], 256)
           for name, opts in variants.items()}
    rows = [{"kind": "stream", "source": name, "path": str(out), "dataset_options": opts}
            for name, opts in variants.items()]
    results = run_rows(rows, args.repeats, lambda s: f"shuffle {s['source']}")
    speed = {e["row"]["source"]: e.get("samples_per_s") for e in results}
    table = [[name, f"{rep[name]['median']:.0f}", f"{rep[name]['p10']:.0f}", f"{rep[name]['ratio']:.2f}x",
              _f(speed[name])] for name in variants]
    names = list(variants)
    t = [target("median distinct classes per 256-batch vs iid", rep[names[1]]["ratio"], 0.9),
         target("read throughput vs the previous order",
                speed[names[1]] / speed[names[0]] if speed[names[0]] and speed[names[1]] else None, 0.9)]
    md = "\n\n".join([
        f"Class-sorted records pack: {classes} classes x {per}, {shard}-sample shards; 256-sample batches; "
        f"read = one StreamingDataset(decode='bytes') epoch in a fresh process; iid expectation "
        f"{rep[names[1]]['iid']:.1f} classes.",
        md_table(["order", "median classes", "p10", "vs iid", "read samples/s"], table), targets_md(t)])
    return {"params": {"classes": classes, "per_class": per, "shard": shard}, "results": results,
            "mixing": rep, "targets": t, "markdown": md}


def section_stream_baseline(args: argparse.Namespace, work: Path, skipped: dict[str, str]) -> dict[str, Any]:
    """A single-source stream's throughput, this checkout against ``--base-tree``: the rows of
    each checkout run in it (``run_fresh(cwd=...)``), rounds interleaved."""
    if args.base_tree is None:
        skipped["stream-baseline"] = "needs --base-tree PATH (a checkout to compare with)"
        return {"params": {}, "results": [], "markdown": "Not run: no --base-tree."}
    trees = {"base": args.base_tree.resolve(), "this": REPO}
    packers = {}
    for name, tree in trees.items():  # which packer each checkout's children import
        out = subprocess.run([sys.executable, "-c", "import packer; print(packer.__file__)"], cwd=tree,
                             capture_output=True, text=True, check=True)
        packers[name] = out.stdout.strip()
        if not packers[name].startswith(str(tree)):
            raise SystemExit(f"a child in {tree} imports {packers[name]}: not that checkout's packer")
    commits = {name: subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=tree, capture_output=True,
                                    text=True).stdout.strip() for name, tree in trees.items()}
    packs = {fmt: sorted_pack(args, work, fmt) for fmt in ("records", "lmdb")}
    rows = [{"kind": "stream", "source": f"{fmt}/{name}", "format": fmt, "tree_name": name, "tree": str(tree),
             "path": str(packs[fmt]), "dataset_options": {"seed": 0}}
            for fmt in packs for name, tree in trees.items()]
    results = run_rows(rows, args.repeats, lambda s: f"stream {s['source']}")

    def rounds(e: dict[str, Any], per_cpu: bool) -> list[float]:
        ok = [r for r in e.get("rounds", []) if "samples_per_s" in r]
        if not per_cpu:
            return [r["samples_per_s"] for r in ok]
        return [r["samples"] / (r["window"]["user_s"] + r["window"]["sys_s"]) for r in ok
                if r["window"]["user_s"] + r["window"]["sys_s"] > 0]

    table, t = [], []
    for fmt in packs:
        base, this = (find(results, format=fmt, tree_name=n) for n in ("base", "this"))
        cells = [fmt]
        for per_cpu in (False, True):
            b = statistics.median(rounds(base, per_cpu)) if base and rounds(base, per_cpu) else None
            n = statistics.median(rounds(this, per_cpu)) if this and rounds(this, per_cpu) else None
            ratio = n / b if n and b else None
            cells += [_f(b), _f(n), _f(ratio, ".3f") + ("x" if ratio else "")]
            t.append(target(f"{fmt}: this vs base, median samples/{'CPU-s' if per_cpu else 's'}", ratio, 0.95))
        table.append(cells)
    md = "\n\n".join([
        f"One StreamingDataset(decode='bytes', seed=0) epoch of {args.shuffle_classes * args.shuffle_per_class} "
        f"32x32 JPEGs in a fresh process per row (records: {args.shuffle_shard}-sample shards; the default "
        f"block shuffle), {args.repeats} interleaved rounds, medians over rounds. base: `{commits['base']}` "
        f"({args.base_tree}), this: `{commits['this']}`.",
        md_table(["format", "base samples/s", "this samples/s", "ratio", "base samples/CPU-s",
                  "this samples/CPU-s", "ratio"], table), targets_md(t)])
    return {"params": {"base_tree": str(args.base_tree), "commits": commits, "packers": packers},
            "results": results, "targets": t, "markdown": md}


# -- crops: transforms per core, one process --------------------------------------------------------
CROP_SETS = (("ImageNet-size (~500x375)", (375, 500)),
             ("photo-like (~576x432, the loaders' and training images)", (432, 576)))


def _crop_sets(count: int, seed: int) -> dict[str, list[bytes]]:
    """``count`` JPEGs of each ``CROP_SETS`` size (+-1/8, every 4th portrait), and the first set
    pre-resized to a 256-px short side."""
    from PIL import Image

    from packer.synth import jpeg_bytes, natural_image

    rng = np.random.default_rng(seed)
    sets: dict[str, list[bytes]] = {label: [] for label, _ in CROP_SETS}
    small = []
    for label, (bh, bw) in CROP_SETS:
        for i in range(count):
            h, w = bh + int(rng.integers(-bh // 8, bh // 8 + 1)), bw + int(rng.integers(-bw // 8, bw // 8 + 1))
            if i % 4 == 3:
                h, w = w, h  # some portrait images
            arr = natural_image(rng, h, w)
            sets[label].append(jpeg_bytes(arr, 90))
            if label == CROP_SETS[0][0]:
                s = 256 / min(h, w)
                small.append(jpeg_bytes(np.asarray(Image.fromarray(arr).resize(
                    (max(256, round(w * s)), max(256, round(h * s))), Image.LANCZOS)), 90))
    return {**sets, "pre-resized (short side 256)": small}


def _cpu_ms_rounds(pipelines: dict[str, Callable[[int], Any]], n: int, rounds: int) -> dict[str, list[float]]:
    """The mean CPU ms per image (this thread) of each pipeline in each round, the order rotating."""
    names = list(pipelines)
    per: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn = pipelines[name]
            t0 = time.thread_time()
            for i in range(n):
                fn(i)
            per[name].append((time.thread_time() - t0) / n * 1e3)
    return per


def _round_ratios(per: dict[str, list[float]], a: str, b: str) -> list[float]:
    """``b``'s CPU per image over ``a``'s in each round (``a``'s speed relative to ``b``)."""
    return [y / x for x, y in zip(per[a], per[b])]


def _crop_set(label: str, data: list[bytes], rounds: int, seed: int
              ) -> tuple[str, dict[str, float], dict[str, list[float]], float]:
    """One image set's table (CPU per image of each pipeline, fidelity): its markdown, the mean
    CPU ms of each pipeline, each packer pipeline's speed against its CPU limit per round, and
    the share of images whose region-decoded crop equals the full decode's bit for bit.

    Each RandomResizedCrop pipeline draws from its own generator, seeded alike once and kept
    across its calls as a transform keeps its own: the pipelines stay in step (each image takes
    the same draws), so every round gives them all the same boxes, and each round new ones. A
    crop's cost depends on its box (a 96-box round's region decode ranges 1.17-1.49x a full
    decode), so the figure is the mean over ``rounds`` x ``len(data)`` boxes, not one fixed set."""
    import torch

    from packer.codecs.image import decode
    from packer.benchmark.fidelity import fidelity_rows, format_fidelity
    from packer.data.decode import DecodeRandomResizedCrop, PilRandomResizedCrop
    from packer.data.decode import reduction_for, resample_box, to_chw3
    from packer.data.decode import DecodeResizeCrop, PilResizeCrop

    n = len(data)
    rrc, pil_rrc = DecodeRandomResizedCrop(224, seed=seed), PilRandomResizedCrop(224, seed=seed)
    drc, pil_drc = DecodeResizeCrop(256, 224), PilResizeCrop(256, 224)

    def full_with(rng: np.random.Generator, i: int) -> Any:
        arr = decode(data[i])
        box, flip = rrc.sample(arr.shape[0], arr.shape[1], rng)
        return torch.from_numpy(to_chw3(resample_box(arr, box, 224, 224, flip=flip)))

    # one pass of the two decodes side by side (their own generators): the region decode's output
    # is the full decode's bit for bit, but where a box twice the output is decoded at a DCT scale
    g_roi, g_full, g_box = (np.random.default_rng(seed) for _ in range(3))
    same = sum(torch.equal(rrc(data[i], rng=g_roi), full_with(g_full, i)) for i in range(n))
    scaled = sum(reduction_for(*rrc.sample(*decode(data[i]).shape[:2], g_box)[0][2:], 224, 224) > 1
                 for i in range(n))

    g_roi, g_full, g_pil, g_limit = (np.random.default_rng(seed) for _ in range(4))
    pipes = {"rrc roi": lambda i: rrc(data[i], rng=g_roi), "rrc full": lambda i: full_with(g_full, i),
             "rrc torchvision": lambda i: pil_rrc(data[i], rng=g_pil),
             "centre roi": lambda i: drc(data[i]), "centre torchvision": lambda i: pil_drc(data[i])}
    limits = cpu_limits()
    if limits:
        out = np.empty((224, 224, 3), np.uint8)
        pipes["rrc limit"] = lambda i: limits["train"](data[i], g_limit, out)
        pipes["centre limit"] = lambda i: limits["packer"](data[i], None, out)
    for fn in pipes.values():  # every pipeline once (the RandomResizedCrop ones one draw each: in step)
        fn(0)
    per = _cpu_ms_rounds(pipes, n, rounds)
    ms = {k: statistics.fmean(v) for k, v in per.items()}
    vs = {kind: _round_ratios(per, f"{kind} roi", f"{kind} limit") for kind in ("rrc", "centre") if limits}

    def row(kind: str, what: str, key: str, base: str) -> list[str]:
        speed = ms[base] / ms[key]
        cells = [f"{CROP_KINDS[kind]}: {what}", f"{ms[key]:.3f}", f"**{speed:.2f}x**" if key.endswith("roi") else f"{speed:.2f}x"]
        if limits:
            ratios = _round_ratios(per, key, f"{kind} limit")
            cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        return cells

    rows = [row("rrc", "full decode + crop + resize", "rrc full", "rrc full"),
            row("rrc", "DecodeRandomResizedCrop (region decode)", "rrc roi", "rrc full"),
            row("rrc", "torchvision (PIL)", "rrc torchvision", "rrc full")]
    if limits:
        rows.append(row("rrc", f"CPU limit ({CPU_LIMIT_WHAT['train']})", "rrc limit", "rrc full"))
    rows += [row("centre", "DecodeResizeCrop", "centre roi", "centre roi"),
             row("centre", "torchvision (PIL)", "centre torchvision", "centre roi")]
    if limits:
        rows.append(row("centre", f"CPU limit ({CPU_LIMIT_WHAT['packer']})", "centre limit", "centre roi"))
    columns = ["pipeline", "CPU ms/image", "speed-up"] + (["vs CPU limit, median of rounds (range)"] if limits else [])
    md = "\n\n".join([f"**{label}**: {n} JPEGs, CPU ms per image on one core (mean of {rounds} rounds, new "
                      f"boxes each round: {rounds * n} boxes); "
                      f"`DecodeRandomResizedCrop`'s output equal to the full decode's, bit for bit, in {same} of {n} "
                      f"({scaled} boxes at least twice the output decoded at a DCT scale, to the reference's fidelity)",
                      md_table(columns, rows),
                      f"Fidelity on the same {n} images (reference: full decode + Lanczos from the exact box)",
                      format_fidelity(fidelity_rows(data, seed=seed))])
    return md, ms, vs, same / n


CROP_KINDS = {"rrc": "RandomResizedCrop(224)+flip", "centre": "Resize(256)+CenterCrop(224)"}


_RST = re.compile(rb"\xff[\xd0-\xd7]")


def _rows_from_restart(jpeg: bytes, r0: int, r1: int, mcu_h: int = 16) -> bytes:
    """MCU rows ``r0`` to ``r1`` of a baseline JPEG with a restart marker after every MCU row, as
    a JPEG of their own: the header with the SOF's height cut, the entropy data from the restart
    before row ``r0`` to the one after row ``r1 - 1``, its markers renumbered from RST0."""
    pos, sof = 2, -1
    while True:  # the header's segments up to the start of scan
        marker, length = jpeg[pos + 1], int.from_bytes(jpeg[pos + 2:pos + 4], "big")
        if marker == 0xC0:
            sof = pos + 5
        pos += 2 + length
        if marker == 0xDA:
            break
    restarts = [m.start() for m in _RST.finditer(jpeg, pos)]
    start = pos if r0 == 0 else restarts[r0 - 1] + 2
    end = restarts[r1 - 1] if r1 - 1 < len(restarts) else len(jpeg) - 2
    body = bytearray(jpeg[start:end])
    for k, m in enumerate(_RST.finditer(body)):
        body[m.start() + 1] = 0xD0 + (k & 7)
    height = min(int.from_bytes(jpeg[sof:sof + 2], "big"), r1 * mcu_h) - r0 * mcu_h
    return jpeg[:sof] + height.to_bytes(2, "big") + jpeg[sof + 2:pos] + bytes(body) + b"\xff\xd9"


def _restart_bound_md(data: list[bytes], rounds: int, seed: int) -> str:
    """What restart markers in the stored JPEGs could save region decoding at most: the set
    re-encoded (OpenCV, q90, 4:2:0) with a restart marker after every MCU row, each
    ``DecodeRandomResizedCrop`` box decoded as now (the rows above it entropy-decoded and
    dropped) and from a stream cut at the restart before it (one MCU row above and below kept,
    for the chroma upsampling's context); pixels compared with the full decode."""
    import cv2

    from packer.codecs import jpeg_region
    from packer.data.decode import DecodeRandomResizedCrop, window

    rrc = DecodeRandomResizedCrop(224, seed=seed)
    jobs = []
    for i, d in enumerate(data):
        bgr = cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_COLOR)
        h, w = bgr.shape[:2]
        ok, enc = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_RST_INTERVAL, -(-w // 16)])
        if not ok:
            raise RuntimeError(f"OpenCV could not re-encode image {i} with restart markers")
        box, _ = rrc.sample(h, w, np.random.default_rng([seed, i]))
        y0, x0, y1, x1 = window(box, h, w, 224, 224)
        r0, r1 = max(0, y0 // 16 - 1), min(-(-h // 16), -(-y1 // 16) + 1)
        full = cv2.cvtColor(cv2.imdecode(enc, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)  # the re-encoded image's
        jobs.append((enc.tobytes(), (y0, x0, y1, x1), (r0, r1), full))

    def now(job: tuple) -> Any:
        jpeg, (y0, x0, y1, x1) = job[:2]
        return jpeg_region.decode_region(jpeg, x0, y0, x1 - x0, y1 - y0)

    def cut(job: tuple) -> Any:
        (y0, x0, y1, x1), (r0, _), cut_jpeg = job[1], job[2], job[4]
        return jpeg_region.decode_region(cut_jpeg, x0, y0 - 16 * r0, x1 - x0, y1 - y0)

    jobs = [(*job, _rows_from_restart(job[0], *job[2])) for job in jobs]
    same = sum(np.array_equal(f(job), job[3][job[1][0]:job[1][2], job[1][1]:job[1][3]])
               for job in jobs for f in (now, cut))
    per = _cpu_ms_rounds({"now": lambda i: now(jobs[i]), "cut": lambda i: cut(jobs[i]),
                          "full": lambda i: jpeg_region.decode_region(jobs[i][0], 0, 0, jobs[i][3].shape[1],
                                                                      jobs[i][3].shape[0]),
                          "cutting": lambda i: _rows_from_restart(jobs[i][0], *jobs[i][2])}, len(jobs), rounds)
    ms = {k: statistics.median(v) for k, v in per.items()}
    return (f"Restart markers, the bound ({len(jobs)} of these JPEGs re-encoded with a restart marker after every "
            f"MCU row, the same boxes; pixels equal to the full decode in {same} of {2 * len(jobs)} box decodes): "
            f"the whole image {ms['full']:.3f} ms, the box as `DecodeRandomResizedCrop` decodes it "
            f"{ms['now']:.3f} ms, the box from the restart before it {ms['cut']:.3f} ms (cutting the stream in "
            f"Python, not counted: {ms['cutting']:.3f} ms). Skipping the rows above the box saves "
            f"{ms['now'] - ms['cut']:.3f} ms an image; the rest is the entropy decoding of the box's own rows "
            "at the image's full width, which no restart layout short of one per MCU can skip.")


def _pre_resize_md(seed: int, per_size: int = 3) -> str:
    from PIL import Image

    from packer.codecs.resize import ResizeSpec, resize_pixels
    from packer.codecs.video import Resize
    from packer.benchmark.fidelity import measure_shift, psnr
    from packer.synth import jpeg_bytes, natural_image

    rng = np.random.default_rng(seed)
    rows = []
    for h, w in [(375, 500), (768, 1024), (1080, 1920), (2000, 3000)]:
        acc: dict[str, tuple[list, list]] = {"packer resize --short-side 256": ([], []),
                                             "decode-frames --short-side 256": ([], [])}
        for _ in range(per_size):
            data = jpeg_bytes(natural_image(rng, h, w), 90)
            full = Image.open(io.BytesIO(data)).convert("RGB")
            outs = {"packer resize --short-side 256": resize_pixels(data, ResizeSpec(short_side=256)),
                    "decode-frames --short-side 256": Resize(short_side=256)(np.asarray(full))}
            for name, out in outs.items():
                ref = np.asarray(full.resize((out.shape[1], out.shape[0]), Image.LANCZOS))
                acc[name][0].append(psnr(out, ref))
                acc[name][1].append(float(np.hypot(*measure_shift(out, ref))))
        rows += [[f"{w}x{h}", name, f"{statistics.median(ps):.2f}", f"{max(sh):.3f}"] for name, (ps, sh) in acc.items()]
    return "\n\n".join(["Pre-resizing to a 256-px short side, against full decode + Lanczos to the same size",
                        md_table(["source", "pipeline", "PSNR median (dB)", "shift max (px)"], rows)])


def section_crops(args: argparse.Namespace, work: Path, skipped: dict[str, str]) -> dict[str, Any]:
    import cv2
    import torch

    from packer.codecs import jpeg_region
    from packer.codecs.image import DECODER

    cv2.setNumThreads(1)  # per core: one thread, whatever the machine's load
    torch.set_num_threads(1)
    parts = [f"Full decoder: {DECODER}; region decoding: {jpeg_region.describe()}. "
             "One process, one thread, every pipeline fed the same boxes."]
    ms, vs, same = {}, {}, {}
    if not cpu_limits():
        skipped["CPU limit rows"] = "simplejpeg is not installed (the turbo extra)"
    for k, (label, data) in enumerate(_crop_sets(args.crop_count, 0).items()):
        md, ms[label], vs[label], same[label] = _crop_set(label, data, args.crop_rounds, 0)
        parts.append(md if k else md + "\n\n" + _restart_bound_md(data, args.crop_rounds, 0))
    parts.append(_pre_resize_md(0, per_size=1 if args.quick else 3))  # --quick: one image per size, 1 of 3 CPU-s
    t = [target(f"{what} vs torchvision's {tv} (PIL), {label}, CPU per image", m[f"{key} torchvision"] / m[f"{key} roi"])
         for label, m in ms.items()
         for key, what, tv in (("rrc", "DecodeRandomResizedCrop(224)", "RandomResizedCrop(224)"),
                               ("centre", "DecodeResizeCrop(256, 224)", "Resize(256)+CenterCrop(224)"))]
    # region decoding's gain where it matters (issue 43: >= 1.3x on ImageNet-size JPEGs)
    big = next(iter(ms.values()))
    t.append(target("DecodeRandomResizedCrop(224) vs full decode + crop + resize, ImageNet-size (~500x375), "
                    "CPU per image", big["rrc full"] / big["rrc roi"], 1.3))
    # the CPU's limit (issue 43): each packer pipeline against its bare loop, the worst round's ratio
    t += [target(f"{what} vs the CPU limit, {label}, CPU per image", statistics.median(r[key]), 0.9)
          for label, r in vs.items() if r
          for key, what in (("rrc", "DecodeRandomResizedCrop(224)"), ("centre", "DecodeResizeCrop(256, 224)"))]
    return {"params": {"count": args.crop_count, "rounds": args.crop_rounds}, "cpu_ms": ms, "vs_cpu_limit": vs,
            "equal_to_full_decode": same,
            "targets": t,
            "markdown": "\n\n".join(parts + [targets_md(t)])}


def section_prefetch(args: argparse.Namespace, work: Path, skipped: dict[str, str]) -> dict[str, Any]:
    """Host-side cost per batch: the uint8 path (stage the batch for the copy engine) against
    normalizing float32 on the CPU; with CUDA, the real ``DevicePrefetcher``'s host time too."""
    import torch

    from packer.data.device import IMAGENET_MEAN, IMAGENET_STD, Normalize
    from packer.data.device import DevicePrefetcher
    from packer.data.decode import DecodeResizeCrop
    from packer.synth import jpeg_bytes, natural_image

    rng = np.random.default_rng(0)
    decode = DecodeResizeCrop(256, 224)
    batch = torch.stack([decode(jpeg_bytes(natural_image(rng, 432, 576), 90)) for _ in range(args.batch_size)])
    reps = 15
    norm = Normalize(IMAGENET_MEAN, IMAGENET_STD)
    stage_u8, stage_f32 = torch.empty_like(batch), torch.empty(batch.shape, dtype=torch.float32)

    def med(fn: Callable[[], Any]) -> float:
        fn()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return 1000 * statistics.median(ts)

    out: dict[str, Any] = {
        "batch_shape": list(batch.shape), "uint8_path_ms": med(lambda: stage_u8.copy_(batch)),
        "cpu_float32_ms": med(lambda: stage_f32.copy_(norm(batch))),
        "prefetcher_cpu_fallback_ms": med(lambda: next(iter(DevicePrefetcher([(batch, 0)], device="cpu"))))}
    out["ratio"] = out["uint8_path_ms"] / out["cpu_float32_ms"]
    if torch.cuda.is_available():  # the real thing: host time spent inside the CUDA prefetcher
        pinned = batch.pin_memory()
        it = iter(DevicePrefetcher([(pinned, torch.zeros(len(batch), dtype=torch.long))] * (reps + 1), device="cuda"))
        next(it)
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            next(it)
            ts.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        out["cuda_prefetcher_host_ms"] = 1000 * statistics.median(ts)
        out["cuda_device"] = torch.cuda.get_device_name()
    cuda = out.get("cuda_prefetcher_host_ms")
    t = [target("uint8 path host cost per batch vs CPU float32 normalization", out["ratio"], 0.5, at_most=True)]
    if cuda is not None:
        t.append(target("CUDA DevicePrefetcher host time per batch vs CPU float32 normalization",
                        cuda / out["cpu_float32_ms"], 0.5, at_most=True, who=out["cuda_device"]))
    rows = [["uint8 path: stage the batch (copy into a preallocated buffer)", f"{out['uint8_path_ms']:.2f}"],
            ["CPU float32: normalize + stage", f"{out['cpu_float32_ms']:.2f}"],
            ["DevicePrefetcher, CPU fallback", f"{out['prefetcher_cpu_fallback_ms']:.2f}"],
            [f"DevicePrefetcher on CUDA ({out.get('cuda_device', 'no CUDA here: not measured')}), host time",
             _f(cuda, ".2f")]]
    md = "\n\n".join([f"Host-side cost per batch {tuple(batch.shape)} uint8 (median of {reps}), in this process.",
                       md_table(["path", "ms per batch"], rows), targets_md(t)])
    return {"results": out, "targets": t, "markdown": md}


def section_ipc(args: argparse.Namespace, work: Path, skipped: dict[str, str]) -> dict[str, Any]:
    """System time of a DataLoader with workers, taken apart: each row changes one thing."""
    import torch

    from packer.conversion.inputs import image_folder as list_folder

    src = image_folder(work / f"images-{args.count}", count=args.count, classes=args.classes)
    items, _ = list_folder(src)
    lmdb = packed(src, work / f"packed-{args.count}" / "data.lmdb", "lmdb", workers=2)
    w, t = max(args.workers), max(args.threads)
    base = dict(base_spec(args, items), source="packer/lmdb", pipeline="packer", loader="DataLoader", parallel=w,
                path=lmdb)
    torch_way = {"env": {"PACKER_REUSE_BATCHES": "0"}}
    variants = {
        "default (default_collate; workers reuse their batch buffers)": {},
        "collate_fn=uint8_collate": {"collate": "uint8"},
        "default, the main process reads every page of the batch": {"touch": True},
        "torch's new segment per batch (PACKER_REUSE_BATCHES=0)": torch_way,
        "the same, the main process reads every page": dict(torch_way, touch=True),
        "the same, sharing strategy file_system": dict(torch_way, sharing="file_system"),
        "in-memory ceiling (no packer reader), default": {"source": "ceiling", "path": None},
        f"packer.Loader, {t} threads (no processes)": {"loader": "Loader", "parallel": t},
    }
    if torch.cuda.is_available():
        variants["pin_memory=True"] = {"pin_memory": True}
    else:
        skipped["pin_memory=True"] = "no CUDA here: DataLoader ignores pin_memory without an accelerator"
    rows = [dict(base, variant=name, **change) for name, change in variants.items()]
    results = run_rows(rows, args.repeats, lambda s: f"ipc {s['variant'][:40]}")
    page = 4096
    shape = (3, 224, 224)
    pages = math.prod(shape) / page
    table = []
    for e in results:
        name = e["row"]["variant"]
        if "error" in e:
            table.append([name, f"failed: {e['error']}"] + [""] * 7)
            continue
        n, main = e["best"]["samples"], e["best"]["window_main"]
        table.append([name, _f(e["samples_per_s"]), _f(per_cpu_s(e)), _f(e["user_ms"], ".2f"), _f(e["sys_ms"], ".3f"),
                      _f(e["sys_share"], ".3f"), _f(e["minflt"], ".1f"), _f(1e3 * main["sys_s"] / n, ".3f"),
                      _f(main["minflt"] / n, ".1f")])
    default = find(results, variant=next(iter(variants)))
    segments = find(results, variant="torch's new segment per batch (PACKER_REUSE_BATCHES=0)")
    t_ = [target(f"default DataLoader {w}: system time / user time", default and default["sys_share"], 0.10,
                 at_most=True),
          target("the default vs torch's segment per batch, img/CPU-s", default and segments
                 and per_cpu_s(default) / per_cpu_s(segments), 1.0)]
    head = (f"packer/lmdb, DecodeResizeCrop(256, 224), batch {args.batch_size}, DataLoader {w} workers unless the row "
            f"says otherwise; {args.steps} batches timed; best of {args.repeats}; each row a fresh process. CPU "
            f"and faults per image over the timed window, the main process and its workers together; the last two "
            f"columns the main process alone. A {shape[0]}x{shape[1]}x{shape[2]} uint8 image is {pages:.2f} pages "
            f"of {page} bytes: torch's default_collate in a worker stacks every batch into a new shared-memory "
            f"segment (allocated, faulted in and freed per batch), about that many faults per image; a worker "
            f"reading a packer dataset stacks into a few reused buffers instead (packer.data.batch_memory).")
    md = "\n\n".join([head, md_table(["variant", "samples/s", "img/CPU-s", "user ms/img", "sys ms/img", "sys/user",
                                       "faults/img", "main sys ms/img", "main faults/img"], table), targets_md(t_)])
    return {"params": {"count": args.count, "workers": w, "threads": t, "shm_pages_per_image": pages},
            "results": results, "targets": t_, "markdown": md}


def child_packer_bench(spec: dict[str, Any]) -> dict[str, Any]:
    """``packer.bench`` on the row's pack as a user runs it (its own fresh processes): each
    ``num_workers`` row's samples/s and CPU ms per sample."""
    import packer

    out = packer.bench(spec["path"], batch_size=spec["batch_size"], workers=spec["workers"], steps=spec["steps"],
                       fidelity=0, progress=False, device="cpu")
    rows = {}
    for s in out["settings"]:
        w = s["window"]
        rows[str(s["num_workers"])] = {"samples_per_s": s["samples_per_s"],
                                       "cpu_ms": 1e3 * (w["user_s"] + w["sys_s"]) / (spec["steps"] * spec["batch_size"])}
    return {"rows": rows}


def section_bench(args: argparse.Namespace, work: Path, skipped: dict[str, str]) -> dict[str, Any]:
    """``packer bench``'s loader rows against a plain script's: the same pack, decode
    (``DecodeResizeCrop(256, 224)``), ``uint8_collate`` and ``num_workers``, each a fresh process,
    rounds interleaved; medians. Target: every row within 10% of the script's samples/s."""
    from packer.conversion.inputs import image_folder as list_folder

    src = image_folder(work / f"images-{args.count}", count=args.count, classes=args.classes)
    items, _ = list_folder(src)
    lmdb = packed(src, work / f"packed-{args.count}" / "data.lmdb", "lmdb", workers=2)
    base = dict(base_spec(args, items), source="packer/lmdb", pipeline="packer", loader="DataLoader", path=lmdb,
                collate="uint8")
    plain: dict[int, list[dict[str, Any]]] = {w: [] for w in args.workers}
    bench: dict[int, list[dict[str, Any]]] = {w: [] for w in args.workers}
    runs = [("bench", None)] + [("plain", w) for w in args.workers]
    for rnd in range(args.repeats):
        shift = rnd % len(runs)
        for kind, w in runs[shift:] + runs[:shift]:
            if kind == "bench":
                r = run_fresh(MODULE, {"kind": "packer-bench", "path": lmdb, "batch_size": args.batch_size,
                                       "workers": args.workers, "steps": args.steps}, timeout=1800)
                for k, row in r.get("rows", {}).items():
                    bench[int(k)].append(row)
                msg = r.get("error") or ", ".join(f"{k}: {v['samples_per_s']:.0f}" for k, v in r["rows"].items())
            else:
                r = run_fresh(MODULE, dict(base, parallel=w))
                if "samples_per_s" in r:
                    plain[w].append({"samples_per_s": r["samples_per_s"], **per_sample(r)})
                msg = r.get("error") or f"{r['samples_per_s']:.0f}"
            print(f"[{rnd}] {kind} {'' if w is None else w}: {msg} (load {os.getloadavg()[0]:.1f})",
                  file=sys.stderr, flush=True)

    def med(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    table, targets, results = [], [], {}
    for w in args.workers:
        p, b = med(plain[w], "samples_per_s"), med(bench[w], "samples_per_s")
        ratio = b / p if p and b else None
        results[w] = {"plain": plain[w], "bench": bench[w], "ratio": ratio}
        pc = med([{"cpu": r["user_ms"] + r["sys_ms"]} for r in plain[w] if "user_ms" in r], "cpu")
        table.append([w, _f(p), _f(b), _f(ratio, ".2f"), _f(pc, ".2f"), _f(med(bench[w], "cpu_ms"), ".2f")])
        # within 10% either way: the larger of the two rates over the smaller, at most 1.1
        targets.append(target(f"packer bench num_workers={w} vs a plain script, samples/s (larger / smaller)",
                              ratio and max(ratio, 1 / ratio), 1.1, at_most=True))
    head = (f"packer/lmdb of {args.count} photo-like JPEGs, DecodeResizeCrop(256, 224), uint8_collate, batch "
            f"{args.batch_size}, {args.steps} batches timed; `packer bench --workers "
            f"{','.join(map(str, args.workers))}` and a plain DataLoader script per num_workers, each a fresh "
            f"process, {args.repeats} interleaved rounds, medians.")
    md = "\n\n".join([head, md_table(["num_workers", "plain script samples/s", "packer bench samples/s", "ratio",
                                        "plain CPU ms/img", "bench CPU ms/img"], table), targets_md(targets)])
    return {"params": {"count": args.count, "workers": args.workers, "repeats": args.repeats},
            "results": results, "targets": targets, "markdown": md}


SECTION_FUNCS = {"loaders": section_loaders, "ipc": section_ipc, "training": section_training, "formats": section_formats,
                 "raw": section_raw, "costs": section_costs, "shuffle": section_shuffle, "crops": section_crops,
                 "prefetch": section_prefetch, "stream-baseline": section_stream_baseline, "bench": section_bench}


# == main ===============================================================================================
def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", default="loaders",
                    help=f"comma list of {', '.join(SECTIONS + OPT_IN)}, or all (all but {', '.join(OPT_IN)})")
    ap.add_argument("--base-tree", type=Path, default=None,
                    help="stream-baseline: the checkout to compare this one with (e.g. a git worktree)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run that proves the script works")
    ap.add_argument("--workdir", type=Path, default=Path("bench-out/read"), help="generated data and packs (kept)")
    ap.add_argument("--results", type=Path, default=None, help="folder for the JSON (default bench-out/results)")
    ap.add_argument("--count", type=int, default=5000, help="generated images")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20, help="batches timed per row, after the first")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved rounds; the best of each row is kept")
    ap.add_argument("--workers", type=_ints, default=[0, 2], help="DataLoader num_workers values")
    ap.add_argument("--threads", type=_ints, default=[1, 2], help="packer.Loader num_threads values")
    ap.add_argument("--formats", type=lambda s: [f for f in s.split(",") if f], default=["lmdb", "records", "hdf5"],
                    help="packer formats in the loaders, formats, costs and training sections")
    ap.add_argument("--peers", type=lambda s: [p for p in s.split(",") if p and p != "none"], default=list(PEERS))
    ap.add_argument("--train-peers", type=lambda s: [p for p in s.split(",") if p and p != "none"],
                    default=list(TRAIN_PEERS))
    ap.add_argument("--peer-python", default=os.environ.get("PACKER_BENCH_PEER_PYTHON") or None,
                    help="the interpreter of the peers' own virtual environment (their dependencies clash "
                         "with packer's): peer rows and the peers' writers run in it, packer's rows in this "
                         "one (default $PACKER_BENCH_PEER_PYTHON, else this interpreter)")
    ap.add_argument("--shuffle-classes", type=int, default=200)
    ap.add_argument("--shuffle-per-class", type=int, default=300)
    ap.add_argument("--shuffle-shard", type=int, default=3000)
    ap.add_argument("--crop-count", type=int, default=96)
    ap.add_argument("--crop-rounds", type=int, default=20)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.count, args.classes, args.batch_size, args.steps, args.repeats = 48, 2, 8, 2, 1
        args.shuffle_classes, args.shuffle_per_class, args.shuffle_shard = 8, 40, 40
        args.crop_count, args.crop_rounds = 4, 1
        if args.workdir == Path("bench-out/read"):
            args.workdir = Path("bench-out/read-quick")
    args.sections = list(SECTIONS) if args.section == "all" else [s for s in args.section.split(",") if s]
    bad = [s for s in args.sections if s not in SECTIONS + OPT_IN]
    if bad:
        ap.error(f"unknown section(s) {bad}; choose from {SECTIONS + OPT_IN}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(Path(args.child).read_text()))), flush=True)
        return 0
    machine = machine_info()
    if args.quick:
        fork_rows()  # tiny sizes prove the rows work: fork them from one warm process (common.fork_rows)
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"quick": args.quick, "sections": {}, "skipped": {}}
    for name in args.sections:
        skipped: dict[str, str] = {}
        t = time.perf_counter()
        out = SECTION_FUNCS[name](args, work, skipped)
        out["seconds"] = time.perf_counter() - t
        out["skipped"] = skipped
        if skipped:
            out["markdown"] += "\n\n" + "\n".join(f"- skipped {k}: {v}" for k, v in skipped.items())
        figures["sections"][name] = out
        print(f"\n## {name}\n\n{out['markdown']}\n", flush=True)
    notes = ["Every row a fresh process with default settings; figures are noisy on a shared machine, "
             "ratios within one run stand."] if not args.quick else [
        "--quick: tiny sizes, every row forked from one process that imported torch and packer; figures meaningless."]
    write_result("read", figures, results=args.results, machine=machine, notes=notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
