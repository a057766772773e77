"""Dataset sources for the tests, written by the peers' own libraries: WebDataset tar shards
(``webdataset.TarWriter``) and Hugging Face datasets (``datasets``: ``save_to_disk``,
``to_parquet``)."""
from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np

__all__ = ["folder_files", "write_shards", "write_hf", "CAPTIONS"]

CAPTIONS = ["a red thing", "zwei Bäume", "", "猫", "a \"quoted\" caption\nwith a newline"]


def folder_files(root: Path) -> list[tuple[str, str, bytes]]:
    """``(class, stem, bytes)`` of every JPEG of an ImageFolder, sorted as packer sorts them."""
    out = []
    for cls in sorted(p.name for p in root.iterdir() if p.is_dir()):
        for f in sorted((root / cls).iterdir()):
            out.append((cls, f.stem, f.read_bytes()))
    return out


def write_shards(root: Path, out: Path, *, per_shard: int = 10, cls: bool = False, shuffle: int | None = None,
                 extra: bool = False, pattern: str = "shard-{:06d}.tar") -> list[Path]:
    """The JPEGs of the ImageFolder ``root`` as WebDataset shards in ``out`` (``webdataset.TarWriter``),
    keys ``class/stem`` (members ``class/stem.jpg``): with ``cls`` a ``.cls`` member (the class's
    index in sorted order), with ``extra`` also ``.txt``, ``.json`` and ``.npy`` members; in folder
    order, or shuffled by the seed ``shuffle``."""
    import webdataset as wds

    files = folder_files(root)
    classes = sorted({c for c, _, _ in files})
    if shuffle is not None:
        random.Random(shuffle).shuffle(files)
    out.mkdir(parents=True, exist_ok=True)
    shards = []
    for k in range(0, len(files), per_shard):
        shards.append(out / pattern.format(k // per_shard))
        with wds.TarWriter(str(shards[-1])) as w:
            for i, (c, stem, data) in enumerate(files[k:k + per_shard], k):
                sample = {"__key__": f"{c}/{stem}", "jpg": data}
                if cls:
                    sample["cls"] = classes.index(c)
                if extra:
                    sample["txt"] = CAPTIONS[i % len(CAPTIONS)]
                    sample["json"] = {"i": i, "tags": [c, stem]}
                    buf = io.BytesIO()
                    np.save(buf, np.arange(i % 4 * 3, dtype=np.float32).reshape(-1, 3))
                    sample["npy"] = buf.getvalue()
                w.write(sample)
    return shards


def write_hf(root: Path, out: Path, *, caption: bool = True, paths: bool = False, parquet: bool = False) -> Path:
    """The JPEGs of the ImageFolder ``root`` as a Hugging Face dataset (an ``Image`` column,
    a ``ClassLabel`` ``label`` and, with ``caption``, a string ``caption``), saved with
    ``save_to_disk`` into ``out`` (which embeds the bytes), or with ``parquet`` written by
    ``to_parquet`` to ``out`` (a file; with ``paths`` the images stay paths, their bytes null)."""
    import datasets

    files = folder_files(root)
    classes = sorted({c for c, _, _ in files})
    features = {"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)}
    if paths:
        images = [{"bytes": None, "path": str(root / c / f"{stem}.jpg")} for c, stem, _ in files]
    else:
        images = [{"bytes": data, "path": f"{stem}.jpg"} for _, stem, data in files]
    columns = {"image": images, "label": [classes.index(c) for c, _, _ in files]}
    if caption:
        features["caption"] = datasets.Value("string")
        columns["caption"] = [CAPTIONS[i % len(CAPTIONS)] for i in range(len(files))]
    ds = datasets.Dataset.from_dict(columns, features=datasets.Features(features))
    if parquet:
        ds.to_parquet(str(out))
    else:
        ds.save_to_disk(str(out))
    return out


def hf_info(out: Path) -> dict:
    """The ``dataset_info.json`` of a ``save_to_disk`` folder."""
    return json.loads((out / "dataset_info.json").read_text())
