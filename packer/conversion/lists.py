"""The list and label files video users have: class indexes, label maps, split lists.

* ``read_class_index``: UCF-101/HMDB51 ``classInd.txt`` (``1 ApplyEyeMakeup``, 1-based),
  a 0-based ``0 name`` index, mmaction2's label maps (``label_map_k400.txt``: one class name
  per line, line number = label; names may hold spaces and parentheses), a Kinetics
  training CSV (its classes in mmaction2's order), or the name of a label map packer ships
  (``ucf101``, ``kinetics400``, ...: ``packer.conversion.labelmaps``); or the training
  data itself: a packer output (its manifest's classes) or a class-folder tree (numbered as
  the command numbers one).
* ``Classes``: the class names by label a listing found, and where that numbering came from
  (for the run's report and the manifest's ``created_by``).
* ``mmaction2_order``: class names ordered as mmaction2's list builder orders them (sorted
  with ``"`` removed and spaces replaced by ``_``), so both tools number a dataset alike.
* ``parse_list_line``: one line of a video list: ``path``, ``path label``, or ``path l1 l2 ...``
  (a multi-label line); UCF-101's ``testlist01.txt`` lines carry no label at all.

CRLF files (UCF-101's split files are CRLF) and a UTF-8 byte-order mark are accepted.
"""
from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from packer.conversion.labelmaps import KNOWN, class_key, known_map
from packer.errors import UsageError
from packer.manifest import MANIFEST_NAME

__all__ = ["ClassIndex", "Classes", "read_class_index", "mmaction2_order", "mmaction2_name", "ListLine",
           "parse_list_line", "read_lines", "is_kinetics_csv", "labels_of", "line_labels"]

_INDEXED = re.compile(r"^(\d+)\s+(\S.*)$")
_INT = re.compile(r"^[+-]?\d+$")
KINETICS_FIELDS = {"label", "youtube_id", "time_start", "time_end"}


def mmaction2_name(name: str) -> str:
    """A class name as mmaction2's Kinetics list builder keys it (``convert_label``)."""
    return name.replace('"', "").replace(" ", "_")


def mmaction2_order(names: Iterable[str]) -> list[str]:
    """Distinct class names sorted as mmaction2 sorts them (by ``mmaction2_name``)."""
    return sorted(set(names), key=lambda n: (mmaction2_name(n), n))


def read_lines(path: str | os.PathLike, what: str) -> list[str]:
    """The lines of a text file without line ends (LF or CRLF) or a UTF-8 BOM."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as e:
        raise UsageError(f"{path}: cannot read {what} ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: {what} is not UTF-8 ({e})") from e
    return text.splitlines()


@dataclass(frozen=True)
class ClassIndex:
    """Class names by label, and how the file numbered them (``base`` 1 for classInd.txt,
    0 for label maps), so list labels written in the file's numbering can be converted."""

    classes: list[str]
    base: int
    # "index" (INDEX NAME lines), "names" (a label map), "csv" (a Kinetics CSV), "builtin",
    # "output" (a packer output's manifest), "tree" (a training class-folder tree)
    kind: str
    source: str = ""  # what the manifest records: a built-in map's name, else the file's path

    def label_of(self, name: str) -> Optional[int]:
        """The label of class ``name`` (also matched with spaces as ``_``, and ignoring case
        where that names one class only), or None."""
        lookup = self.__dict__.get("_lookup")
        if lookup is None:
            lookup, folded = {}, {}
            for i, c in enumerate(self.classes):
                lookup.setdefault(c, i)
                lookup.setdefault(mmaction2_name(c), i)
                folded.setdefault(class_key(c), []).append(i)
            for key, found in folded.items():  # "HandStandPushups" is classInd's "HandstandPushups"
                if len(found) == 1:
                    lookup.setdefault(key, found[0])
            object.__setattr__(self, "_lookup", lookup)
        return lookup.get(name, lookup.get(mmaction2_name(name), lookup.get(class_key(name))))

    def describe(self) -> str:
        """Where these classes come from, for reports."""
        m = known_map(self.source) if self.kind == "builtin" else None
        return m.describe() if m is not None else f"--class-index {self.source}"


class Classes(list):
    """Class names by label (a list), plus where that numbering came from: ``label_map`` is
    what the manifest's ``created_by`` records (a built-in map's name, a ``--class-index``
    file's path, ``sorted``: the names found, sorted; ``list``: the list's own numbers;
    None: no classes), ``note`` the sentence a run's report prints."""

    def __init__(self, names: Iterable[str] = (), *, label_map: Optional[str] = None, note: str = ""):
        super().__init__(names)
        self.label_map = label_map
        self.note = note

    def first_labels(self, n: int = 5) -> str:
        """``0 a, 1 b, ... 9 z``: the numbering, shortened for a report line."""
        shown = ", ".join(f"{i} {c}" for i, c in enumerate(self[:n]))
        return shown + (f", ... {len(self) - 1} {self[-1]} (all in the manifest's classes)"
                        if len(self) > n else "")

    @classmethod
    def of_index(cls, index: "ClassIndex") -> "Classes":
        """``index``'s classes, noted as coming from it."""
        return cls(index.classes, label_map=index.source,
                   note=f"{len(index.classes)} classes numbered by {index.describe()}")


def is_kinetics_csv(path: str | os.PathLike) -> bool:
    """True when the file's first line is a Kinetics CSV header (label, youtube_id, ...)."""
    lines = read_lines(path, "class index")
    head = {f.strip().lower() for f in lines[0].split(",")} if lines else set()
    return KINETICS_FIELDS <= head


_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def _packed_output(path: Path) -> bool:
    if path.is_dir():
        return (path / MANIFEST_NAME).is_file()
    with open(path, "rb") as f:
        return f.read(len(_HDF5_MAGIC)) == _HDF5_MAGIC


def read_class_index(path: str | os.PathLike, *,
                     tree: Optional[Callable[[Path], list[str]]] = None) -> ClassIndex:
    """Read a class index in any of the forms above (see the module docstring), or the
    classes of a training output: a packer output (its manifest's classes, as its labels
    were stored) or, with ``tree`` (the command's numbering of a class-folder tree), a
    training tree's class folders."""
    builtin = known_map(str(path))
    path = Path(path)
    if builtin is not None:
        if path.exists():
            raise UsageError(f"--class-index {path}: both packer's built-in {builtin.title} label map and "
                             f"a file of that name; write ./{path} for the file")
        return ClassIndex(builtin.classes, 0, "builtin", builtin.name)
    if not path.exists():
        raise UsageError(f"{path}: class index file does not exist (or give a built-in label map: "
                         f"{', '.join(KNOWN)})")
    source = str(path.resolve())
    if _packed_output(path):
        from packer.formats import open_reader

        reader = open_reader(path, check_crc=False)  # (the manifest's own checksum is checked)
        try:
            classes = list(reader.manifest.classes)
        finally:
            reader.close()
        if not classes:
            raise UsageError(f"{path}: this output has no class names to number by")
        return ClassIndex(classes, 0, "output", source)
    if path.is_dir():
        if tree is None:
            raise UsageError(f"{path}: a folder is not a class index here")
        return ClassIndex(list(tree(path)), 0, "tree", source)
    if is_kinetics_csv(path):
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
        names = [(r.get("label") or "").strip() for r in rows]
        if not any(names):
            raise UsageError(f"{path}: a Kinetics CSV without labels cannot name the classes")
        return ClassIndex(mmaction2_order(n for n in names if n), 0, "csv", source)
    lines = [(n, line.strip()) for n, line in enumerate(read_lines(path, "class index"), 1) if line.strip()]
    if not lines:
        raise UsageError(f"{path}: class index file is empty")
    indexed = [_INDEXED.match(line) for _, line in lines]
    if all(indexed):
        found: dict[int, str] = {}
        for (lineno, line), m in zip(lines, indexed):
            index, name = int(m.group(1)), m.group(2).strip()
            if index in found or name in found.values():
                raise UsageError(f"{path}:{lineno}: {line!r} repeats an index or a name")
            found[index] = name
        base = min(found)
        if base not in (0, 1) or sorted(found) != list(range(base, base + len(found))):
            raise UsageError(f"{path}: indices must run 1..{len(found)} (or 0..{len(found) - 1}) "
                             "without gaps")
        return ClassIndex([found[i] for i in sorted(found)], base, "index", source)
    seen: dict[str, int] = {}
    for lineno, name in lines:  # a label map: one class name per line
        if name in seen:
            raise UsageError(f"{path}:{lineno}: class {name!r} is listed twice (also line {seen[name]})")
        seen[name] = lineno
    return ClassIndex([name for _, name in lines], 0, "names", source)


@dataclass(frozen=True)
class ListLine:
    """One video list line: the path and its labels (none, one, or several)."""

    path: str
    labels: tuple[int, ...]


def parse_list_line(line: str, where: str) -> ListLine:
    """``path [label ...]``: the labels are the trailing integer fields (at least one field
    is left for the path, which may itself contain spaces)."""
    parts = line.split()
    if not parts:
        raise UsageError(f"{where}: empty line")
    k = len(parts)
    while k > 1 and _INT.match(parts[k - 1]):
        k -= 1
    labels = tuple(int(p) for p in parts[k:])
    # keep the path's own inner spacing: cut the line after its k-th field
    rest = line.strip()
    for p in parts[k:][::-1]:
        rest = rest[: rest.rfind(p)].rstrip()
    return ListLine(rest, labels)


def labels_of(names: Iterable[str], index: Optional[ClassIndex], where: str,
              source: str | os.PathLike | None) -> tuple[list[str], dict[str, int]]:
    """(classes, name -> label): ``index``'s classes, or the names in mmaction2's order."""
    names = set(names)
    if index is None:
        classes = mmaction2_order(names)
        return classes, {n: i for i, n in enumerate(classes)}
    found = {n: index.label_of(n) for n in names}
    missing = sorted(n for n, label in found.items() if label is None)
    if missing:
        raise UsageError(f"{where}: classes not in {source}: {', '.join(missing[:5])}"
                         + (" ..." if len(missing) > 5 else ""))
    return index.classes, found


def line_labels(found: tuple[int, ...], key: str, index: Optional[ClassIndex],
                where: str) -> tuple[int, ...]:
    """The 0-based labels of one list line (see ``video_list``)."""
    if index is None:
        if any(x < -1 for x in found):
            raise UsageError(f"{where}: negative label in {found}")
        return found or (-1,)
    folder = key.split("/")[0] if "/" in key else None
    from_folder = index.label_of(folder) if folder is not None else None
    if not found:
        if from_folder is None:
            raise UsageError(f"{where}: no label, and its folder {folder!r} is not a class of the class index")
        return (from_folder,)
    labels = tuple(x - index.base for x in found)
    bad = [x for x in found if not 0 <= x - index.base < len(index.classes)]
    if bad:
        raise UsageError(f"{where}: label {bad[0]} is outside the class index "
                         f"({index.base}..{len(index.classes) - 1 + index.base})")
    if len(labels) == 1 and from_folder is not None and labels[0] != from_folder:
        raise UsageError(f"{where}: label {found[0]} is class {index.classes[labels[0]]!r} in the class "
                         f"index, but the video is in folder {folder!r}")
    return labels
