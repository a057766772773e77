"""Walk inputs into ``Item``s: ImageFolder trees and ``relative/path label`` list files.

Order is deterministic (sorted by key), hidden files and folders are skipped, symlinked
folders are not followed (no loops), and list files may not point outside their root.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .errors import UsageError

__all__ = ["Item", "DEFAULT_IMAGE_EXTS", "parse_exts", "image_folder", "list_file",
           "image_items", "image_tree", "partition", "fingerprint", "safe_key"]

DEFAULT_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")


@dataclass(frozen=True)
class Item:
    """One input: ``key`` is the path relative to the root with ``/`` separators."""

    key: str
    path: str
    label: int


def parse_exts(exts: str | Iterable[str] | None) -> tuple[str, ...]:
    """Normalise an extension filter (``"jpg,PNG"`` or a list) to lower-case names without dots."""
    if exts is None:
        return DEFAULT_IMAGE_EXTS
    if isinstance(exts, str):
        exts = exts.split(",")
    out = tuple(e.strip().lower().lstrip(".") for e in exts if e.strip())
    if not out:
        raise UsageError("--ext names no extension")
    return out


def _has_ext(name: str, exts: Sequence[str]) -> bool:
    return name.rsplit(".", 1)[-1].lower() in exts if "." in name else False


def _walk_files(top: Path) -> list[str]:
    """Relative paths of the non-hidden files below ``top``; symlinked folders are not entered."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = os.path.relpath(dirpath, top)
        for name in filenames:
            if name.startswith("."):
                continue
            found.append(name if rel == "." else os.path.join(rel, name))
    return found


def safe_key(rel: str, where: str) -> str:
    """Normalise a relative path to a ``/`` key; refuse absolute paths, ``..`` and control characters."""
    key = rel.replace(os.sep, "/")
    parts = key.split("/")
    if key.startswith("/") or os.path.isabs(rel) or ".." in parts or any(ord(ch) < 32 for ch in key):
        raise UsageError(f"{where}: refusing path {rel!r} (absolute, '..' or control characters)")
    return "/".join(p for p in parts if p not in ("", "."))


def image_folder(root: str | os.PathLike, exts: Sequence[str] = DEFAULT_IMAGE_EXTS) -> tuple[list[Item], list[str]]:
    """An ImageFolder tree ``root/<class>/<file>``: classes sorted, label = class index."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root}: input folder does not exist")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise UsageError(f"{root}: no class folders (expected ROOT/<class>/<image>)")
    items = []
    for label, cls in enumerate(classes):
        for rel in _walk_files(root / cls):
            if _has_ext(rel, exts):
                key = safe_key(f"{cls}/{rel}", str(root))
                items.append(Item(key, str(root / cls / rel), label))
    items.sort(key=lambda it: (it.label, it.key))
    return items, classes


def image_tree(root: str | os.PathLike, exts: Sequence[str] = DEFAULT_IMAGE_EXTS) -> list[Item]:
    """Every image file below ``root`` in any layout (ImageFolder or not), sorted by key; label 0."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root}: input folder does not exist")
    items = [Item(safe_key(rel, str(root)), str(root / rel), 0)
             for rel in _walk_files(root) if _has_ext(rel, exts)]
    items.sort(key=lambda it: it.key)
    return items


def list_file(list_path: str | os.PathLike, root: str | os.PathLike,
              exts: Sequence[str] | None = None) -> tuple[list[Item], list[str]]:
    """A list file of ``relative/path label`` lines (the path may contain spaces); order kept.

    Classes are ``"0".."max label"``; blank lines and ``#`` comments are skipped.
    """
    list_path, root = Path(list_path), Path(root)
    if not list_path.is_file():
        raise UsageError(f"{list_path}: list file does not exist")
    if not root.is_dir():
        raise UsageError(f"{root}: root folder does not exist")
    items = []
    seen = set()
    with open(list_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.rsplit(None, 1)
            where = f"{list_path}:{lineno}"
            if len(parts) != 2:
                raise UsageError(f"{where}: expected 'relative/path label', got {line!r}")
            try:
                label = int(parts[1])
            except ValueError:
                raise UsageError(f"{where}: label {parts[1]!r} is not an integer") from None
            if label < 0:
                raise UsageError(f"{where}: negative label {label}")
            key = safe_key(parts[0].strip(), where)
            if exts is not None and not _has_ext(key, exts):
                continue
            if key in seen:
                raise UsageError(f"{where}: {key!r} is listed twice")
            seen.add(key)
            items.append(Item(key, str(root / key), label))
    n = max((it.label for it in items), default=-1) + 1
    return items, [str(i) for i in range(n)]


def image_items(src: str | os.PathLike, *, list_path: str | os.PathLike | None = None,
                exts: str | Sequence[str] | None = None) -> tuple[list[Item], list[str]]:
    """Items of an image dataset: an ImageFolder ``src``, or ``list_path`` relative to ``src``."""
    exts = parse_exts(exts)
    if list_path is not None:
        return list_file(list_path, src, exts)
    return image_folder(src, exts)


def partition(items: Sequence[Item], num_shards: int, shard_index: int) -> list[Item]:
    """The ``shard_index``-th of ``num_shards`` contiguous, near-equal parts of the sorted input."""
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise UsageError(f"--shard-index must be in [0, {num_shards}) with --num-shards >= 1")
    n = len(items)
    start = n * shard_index // num_shards
    end = n * (shard_index + 1) // num_shards
    return list(items[start:end])


def fingerprint(items: Sequence[Item]) -> str:
    """A hash of the input list (keys and labels), to refuse resuming on a changed input."""
    h = hashlib.sha256()
    for it in items:
        h.update(f"{it.key}\0{it.label}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()
