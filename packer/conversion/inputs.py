"""Walk inputs into ``Item``s: ImageFolder trees and ``relative/path label`` list files, plus what
every input walk shares (extensions, safe keys, partitions, shuffles). Video layouts:
``packer.conversion.video_inputs``.

Order is deterministic (sorted by key), hidden files and folders are skipped, symlinked
folders are not followed (no loops), and list files may not point outside their root.
"""
from __future__ import annotations

import hashlib
import json
import logging
import operator
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from packer.conversion import lists
from packer.conversion.input_failures import InputFailure, bad_line
from packer.conversion.options import DEFAULT_IMAGE_EXTS, DEFAULT_VIDEO_EXTS
from packer.conversion.placement import OUTPUT_MARKERS, is_output_folder
from packer.errors import CorruptSample, UsageError
from packer.fileio import read_file_stat, visible_files
from packer.heap import collector_paused

__all__ = ["Item", "FieldItem", "SourceItem", "SourceListing", "read_item", "read_item_bytes", "InputFailure", "DEFAULT_IMAGE_EXTS", "DEFAULT_VIDEO_EXTS", "parse_exts", "image_folder",
           "list_file", "image_items", "image_tree", "partition", "shuffle_items", "safe_key", "has_ext",
           "walk_files", "class_files", "top_level", "listing", "run_failures"]

log = logging.getLogger(__name__)



@dataclass(frozen=True, init=False)
class Item:
    """One input: ``key`` is the path relative to the root with ``/`` separators."""

    key: str
    path: str
    label: int

    def __init__(self, key: str, path: str, label: int):
        # (a frozen dataclass's own __init__ sets each field through object.__setattr__: twice
        # the time, for each of the millions of items a listing makes)
        fields = self.__dict__
        fields["key"], fields["path"], fields["label"] = key, path, label


def parse_exts(exts: str | Iterable[str] | None,
               default: tuple[str, ...] = DEFAULT_IMAGE_EXTS) -> tuple[str, ...]:
    """Normalise an extension filter (``"jpg,PNG"`` or a list) to lower-case names without dots."""
    if exts is None:
        return default
    if isinstance(exts, str):
        exts = exts.split(",")
    out = tuple(e.strip().lower().lstrip(".") for e in exts if e.strip())
    if not out:
        raise UsageError("--ext names no extension")
    return out


def has_ext(name: str, exts: Sequence[str]) -> bool:
    return name.rsplit(".", 1)[-1].lower() in exts if "." in name else False


def _with_ext(names: Iterable[str], exts: Sequence[str]) -> list[str]:
    """The ``names`` that ``has_ext`` takes, in order; for the usual extensions (ASCII, without
    dots) one ``endswith`` per name, the same test in C (a listing has millions of names)."""
    if all(e.isascii() and "." not in e and e == e.lower() for e in exts):
        dotted = tuple("." + e for e in exts)  # (exts are lower case: most names end in one as they are)
        return [name for name in names if name.endswith(dotted) or name.lower().endswith(dotted)]
    return [name for name in names if has_ext(name, exts)]


def walk_files(top: Path, failures: list[InputFailure] | None = None,
               exts: Sequence[str] | None = None, key_prefix: str = "") -> list[str]:
    """Relative paths of the non-hidden files below ``top``; symlinked folders are not entered.
    Only regular files (or symlinks to one) are inputs: a named pipe, socket or device is left
    out, and an ``InputFailure`` naming it when its name has one of ``exts`` (None: any name;
    it was meant as an input; never opened: a pipe's read would wait forever), its key being
    ``key_prefix`` and its path below ``top``.

    A folder that cannot be listed (no permission, an I/O error, a path too long) is an
    ``InputFailure`` naming it in ``failures`` (its files are neither packed nor dropped
    silently), or a ``UsageError`` without that list. ``os.walk`` alone skips it in silence.
    A folder holding a packer output (finished or partial) is no input: it is not entered."""
    def unlisted(e: OSError) -> None:
        bad_line(failures, str(e.filename or top), 0,
                 f"cannot list this folder ({e.strerror or e}): the files in it are not packed")

    def irregular(rel: str, kind: str) -> None:  # reading it could block forever or never end
        if exts is not None and not has_ext(rel, exts):
            return  # not named as an input: left out, as the extension filter leaves out any file
        name = key_prefix + os.fsencode(rel).decode("utf-8", "replace").replace(os.sep, "/")
        bad_line(failures, str(top), 0, f"{name}: is {kind}, not a regular file: not an input", name)

    return visible_files(top, unlisted, irregular, skip=is_output_folder)


_CONTROL = re.compile("[\x00-\x1f]")


def safe_key(rel: str, where: str) -> str:
    """Normalise a relative path to a ``/`` key; refuse absolute paths, ``..`` and control characters."""
    key = rel.replace(os.sep, "/")
    parts = key.split("/")
    if key.startswith("/") or os.path.isabs(rel) or ".." in parts or _CONTROL.search(key):
        raise UsageError(f"{where}: refusing path {rel!r} (absolute, '..' or control characters)")
    try:  # a name that is not UTF-8 (Linux bytes, surrogate-escaped) cannot be a key in keys.json
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{where}: refusing path {rel!r} (file name is not valid UTF-8)") from None
    if "" in parts or "." in parts:
        return "/".join(p for p in parts if p not in ("", "."))
    return key


def _plain_names(cls: str, rels: list[str]) -> bool:
    """Whether ``safe_key(f"{cls}/{rel}")`` is that very string for every ``rel`` of a walk (checked
    for all of them at once: a walk yields no empty, ``.`` or ``..`` part and no leading ``/``,
    so only control characters and names that are not UTF-8 are left to rule out)."""
    if os.sep != "/" or not cls or cls.startswith(".") or "/" in cls:
        return False
    joined = cls + "/" + "/".join(rels)
    if _CONTROL.search(joined):
        return False
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_FIRST = operator.itemgetter(0)


def class_files(root: Path, cls: str, exts: Sequence[str],
                failures: list[InputFailure] | None) -> Iterator[tuple[str, str]]:
    """``(key, path relative to the class folder)`` of each file with one of ``exts`` under
    ``root/cls``, sorted by key; a name that cannot be a key, or a folder that cannot be listed,
    is recorded in ``failures`` (or refused)."""
    rels = _with_ext(sorted(walk_files(root / cls, failures, exts, f"{cls}/")), exts)
    if _plain_names(cls, rels):  # the usual folder: every key is the class and the path, as it is
        yield from zip([f"{cls}/{rel}" for rel in rels], rels)  # (sorted by rel is sorted by key)
        return
    keyed = []
    for rel in rels:
        try:
            keyed.append((safe_key(f"{cls}/{rel}", str(root)), rel))
        except UsageError as e:
            bad_line(failures, str(root / cls), 0, str(e).removeprefix(f"{root}: "),
                     os.fsencode(rel).decode("utf-8", "replace"))
    keyed.sort(key=_FIRST)  # a normalised key may sort elsewhere than its name
    yield from keyed


def top_level(root: Path, exts: Sequence[str]) -> tuple[list[str], list[str]]:
    """The sorted, non-hidden folders of a class-folder tree's ``root`` (one per class) and the
    sorted names of the files with one of ``exts`` beside them (they belong to no class: the
    caller records them, as no documented filter leaves them out). A folder holding a packer
    output (an earlier run's output or partial output put there) is no class: it is left out."""
    if not root.is_dir():
        raise UsageError(f"{root}: input folder does not exist")
    folders, files = [], []
    for entry in root.iterdir():
        if entry.name.startswith("."):
            continue
        if not entry.is_dir():
            files.append(entry.name)
        elif any((entry / name).exists() for name in OUTPUT_MARKERS):
            log.warning("%s: a packer output, not a class folder: left out", entry)
        else:
            folders.append(entry.name)
    return sorted(folders), _with_ext(sorted(files), exts)


def image_folder(root: str | os.PathLike, exts: Sequence[str] = DEFAULT_IMAGE_EXTS, *,
                 class_index: str | os.PathLike | None = None,
                 failures: list[InputFailure] | None = None) -> tuple[list[Item], list[str]]:
    """An ImageFolder tree ``root/<class>/<file>``: classes sorted (byte order, as torchvision's
    ``ImageFolder``), label = class index; or, with ``class_index`` (the training classes: a
    label map, ``classInd.txt``, ...; see ``lists.read_class_index``), that file's numbering,
    for a validation tree that lacks some of them (a folder it lacks is refused).
    A file whose name cannot be a key (not UTF-8, control characters), an image beside the class
    folders (it belongs to no class) and a folder that cannot be listed go to ``failures``.
    The classes are a ``lists.Classes``."""
    root = Path(root)
    names, loose = top_level(root, exts)
    if not names:
        raise UsageError(f"{root}: no class folders (expected ROOT/<class>/<image>)")
    for name in loose:
        bad_line(failures, str(root), 0, f"{name}: an image beside the class folders belongs to no class", name)
    if class_index is not None:
        index = lists.read_class_index(class_index, tree=lambda train: top_level(train, exts)[0])
        classes = lists.Classes.of_index(index)
        label_of = lists.labels_of(names, index, str(root), class_index)[1]
    else:  # (no label_map recorded: the manifest stays as it always was)
        classes = lists.Classes(names)
        classes.note = f"{len(names)} class folders numbered in sorted order (byte order): {classes.first_labels()}"
        label_of = {n: i for i, n in enumerate(names)}
    items = []
    # (in (label, key) order as made when the labels follow the sorted classes, and class_files
    # gives each class's files sorted by key)
    for cls in sorted(names, key=label_of.__getitem__):
        base = os.path.join(root, cls, "")  # one join per class: millions of files share it
        label = label_of[cls]
        items.extend(Item(key, base + rel, label) for key, rel in class_files(root, cls, exts, failures))
    return items, classes


def image_tree(root: str | os.PathLike, exts: Sequence[str] = DEFAULT_IMAGE_EXTS, *,
               failures: list[InputFailure] | None = None) -> list[Item]:
    """Every image file below ``root`` in any layout (ImageFolder or not), sorted by key; label 0.
    A folder that cannot be listed goes to ``failures`` (see ``walk_files``)."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root}: input folder does not exist")
    items = [Item(safe_key(rel, str(root)), str(root / rel), 0)
             for rel in walk_files(root, failures, exts) if has_ext(rel, exts)]
    items.sort(key=lambda it: it.key)
    return items


def list_file(list_path: str | os.PathLike, root: str | os.PathLike,
              exts: Sequence[str] | None = None, *,
              failures: list[InputFailure] | None = None) -> tuple[list[Item], list[str]]:
    """A list file of ``relative/path label`` lines (the path may contain spaces); order kept.

    Classes are ``"0".."max label"``; blank lines and ``#`` comments are skipped. Every other
    line becomes an item or, when it cannot (no label, a label that is not a non-negative
    integer, an unsafe path, an extension outside ``exts``, a repeated path), an
    ``InputFailure`` appended to ``failures`` (a UsageError without that list).
    """
    list_path, root = Path(list_path), Path(root)
    if not list_path.is_file():
        raise UsageError(f"{list_path}: list file does not exist")
    if not root.is_dir():
        raise UsageError(f"{root}: root folder does not exist")
    items = []
    seen: dict[str, int] = {}
    with open(list_path, encoding="utf-8-sig") as f:  # a BOM (Windows editors) is not part of a path
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.rsplit(None, 1)
            where = f"{list_path}:{lineno}"
            if len(parts) != 2:
                bad_line(failures, str(list_path), lineno, f"expected 'relative/path label', got {line!r}")
                continue
            try:
                label = int(parts[1])
            except ValueError:
                bad_line(failures, str(list_path), lineno, f"label {parts[1]!r} is not an integer", parts[0])
                continue
            if label < 0:
                bad_line(failures, str(list_path), lineno, f"negative label {label}", parts[0])
                continue
            try:
                key = safe_key(parts[0].strip(), where)
            except UsageError as e:
                bad_line(failures, str(list_path), lineno, str(e).removeprefix(where + ": "), parts[0])
                continue
            if exts is not None and not has_ext(key, exts):
                bad_line(failures, str(list_path), lineno,
                          f"{key!r} does not end in one of the extensions taken ({', '.join(exts)}); "
                          f"is this line in another format (e.g. several labels)?", key)
                continue
            if key in seen:
                bad_line(failures, str(list_path), lineno, f"{key!r} is listed twice (first at line {seen[key]})", key)
                continue
            seen[key] = lineno
            items.append(Item(key, str(root / key), label))
    n = max((it.label for it in items), default=-1) + 1
    return items, [str(i) for i in range(n)]


def image_items(src: str | os.PathLike, *, list_path: str | os.PathLike | None = None,
                exts: str | Sequence[str] | None = None, class_index: str | os.PathLike | None = None,
                failures: list[InputFailure] | None = None) -> tuple[list[Item], list[str]]:
    """Items of an image dataset: an ImageFolder ``src`` (numbered by ``class_index`` when
    given), or ``list_path`` relative to ``src``. Unusable lines/entries go to ``failures``
    (see ``InputFailure``)."""
    exts = parse_exts(exts)
    if list_path is not None and class_index is not None:
        raise UsageError("--class-index numbers class folders; a --list gives its own labels")
    with collector_paused():  # an item per input, all kept: nothing for the collector to find
        if list_path is not None:
            return list_file(list_path, src, exts, failures=failures)
        return image_folder(src, exts, class_index=class_index, failures=failures)


def partition(items: Sequence[Item], num_shards: int, shard_index: int) -> list[Item]:
    """The ``shard_index``-th of ``num_shards`` contiguous, near-equal parts of the sorted input."""
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise UsageError(f"--shard-index must be in [0, {num_shards}) with --num-shards >= 1")
    n = len(items)
    start = n * shard_index // num_shards
    end = n * (shard_index + 1) // num_shards
    return list(items[start:end])


def listing(items: Sequence[Item], failures: Sequence[InputFailure] = (),
            lists: dict[str, str | os.PathLike | None] | None = None) -> dict[str, object]:
    """What every part of a split run (``--num-shards``) records of the WHOLE listing it was cut
    from, so that ``packer merge`` can refuse parts cut from different listings (a tree or list
    that changed between the parts moves the split points: inputs are lost or doubled):
    the number of items and a sha256 over their keys and labels in listed order, the number and
    a sha256 of the unusable lines and entries, and a sha256 of each list/CSV file's bytes
    (``lists``: role -> path, e.g. ``{"list": ...}``; None paths are left out)."""
    h = hashlib.sha256()
    # (keys hold no control characters, see safe_key: tab and newline separate unambiguously)
    for it in items:
        labels = getattr(it, "labels", None)
        line = f"{it.key}\t{it.label}\t{','.join(map(str, labels)) if labels else ''}\n"
        h.update(line.encode("utf-8", "surrogatepass"))
    bad = hashlib.sha256()
    for f in failures:
        bad.update(json.dumps(f.record(), sort_keys=True).encode("utf-8", "surrogatepass") + b"\n")
    # (flat, self-naming fields: a resume refused over them names each as an option)
    record: dict[str, object] = {"listed_inputs": len(items), "listed_inputs_sha256": h.hexdigest(),
                                 "unusable_inputs": len(failures), "unusable_inputs_sha256": bad.hexdigest()}
    for role, path in sorted((lists or {}).items()):
        if path is not None:
            record[f"{role}_file_sha256"] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return record


def run_failures(failures: Sequence[InputFailure], shard_index: int) -> list[InputFailure]:
    """The unusable input lines a part of a split run records: all of them in part 0, none in
    the others. They belong to the run, not to a part: recorded once, the merged
    ``failures.jsonl`` (the parts' in shard order) equals a single run's."""
    return list(failures) if shard_index == 0 else []


def shuffle_items(items: Sequence[Item], seed: int) -> list[Item]:
    """``items`` in a permutation fixed by ``seed`` (Python's ``random.Random(seed).shuffle``:
    the same on every platform and Python version)."""
    if int(seed) < 0:
        raise UsageError(f"--shuffle takes a seed >= 0, not {seed}")
    out = list(items)
    random.Random(int(seed)).shuffle(out)
    return out


def read_item_bytes(item: Item) -> bytes:
    """Read an input file; an unreadable file is a ``CorruptSample`` at stage ``read``."""
    return read_item(item)[0]


def read_item(item: Item) -> tuple[bytes, tuple[int, int] | None]:
    """``read_item_bytes`` and the file's ``(size, mtime_ns)`` as it was read (a ``SourceItem``
    reads itself out of its container: its image's bytes and the container's stat)."""
    if isinstance(item, SourceItem):
        return item.read()
    try:
        return read_file_stat(item.path)
    except OSError as e:
        raise CorruptSample(item.key, item.path, f"cannot read file ({e.strerror or e})", stage="read") from e


@dataclass(frozen=True, init=False)
class FieldItem(Item):
    """An input of a field pack (``packer.conversion.coco``, ``packer.conversion.tables``): an
    ``Item`` (``path`` is its first image's file, ``label`` its identity in the resume fingerprint
    and ``sources.bin``: a digest of its annotations or row values, which ``--append`` compares) and
    the values of its other fields as the source gave them (image fields: relative paths)."""

    values: dict = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __init__(self, key: str, path: str, label: int, values: dict):
        super().__init__(key, path, label)
        self.__dict__["values"] = values


@dataclass(frozen=True, init=False)
class SourceItem(FieldItem):
    """A sample inside a container file: a WebDataset tar shard's members
    (``packer.conversion.shards``) or a row of an Arrow or Parquet file
    (``packer.conversion.arrow``). ``path`` names the container (what ``failures.jsonl`` and
    the resume check name); the item holds only where its bytes are, never the bytes, and reads
    them itself where the work runs. ``values`` is None: ``read_values`` gives them."""

    def read(self) -> tuple[bytes, tuple[int, int] | None]:
        """The encoded bytes of the sample's (first) image and the container's ``(size,
        mtime_ns)`` as it was read (None: not a local file); ``CorruptSample`` when they
        cannot be read."""
        raise NotImplementedError

    def read_values(self) -> tuple[dict[str, Any], tuple[int, int] | None]:
        """Every field's value (image fields: their encoded bytes) and the container's stat;
        ``CorruptSample`` naming the container and the key when one cannot be read."""
        raise NotImplementedError

    def identity(self) -> tuple[int, int]:
        """The ``(size, mtime_ns)`` the resume compares: the container file's (``(-1, -1)`` when
        it cannot be stat'ed); a container at a URL gives what stands for its version."""
        from packer.conversion.fingerprint import file_stat

        return file_stat(self.path)


@dataclass
class SourceListing:
    """What a dataset source (``packer.conversion.sources``) lists: its items in packed order,
    the classes by label, the schema (None: a plain image pack of image and label, as a class
    folder gives), the entries that cannot be items, what the manifest's ``created_by``
    records of the source (``source``: its format; never where it lives), and the sentence a
    report prints about the labels."""

    items: list
    classes: list
    schema: Any
    failures: list[InputFailure]
    recorded: dict[str, Any]
    note: str = ""
