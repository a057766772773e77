"""The public label maps of the video datasets packer users convert, shipped with packer.

A class-folder tree whose classes are one of these datasets' takes the dataset's own labels
(``identify``), not an order packer makes up: UCF-101's ``classInd.txt`` sorts its classes
ignoring case (``Hammering`` 34, ``HammerThrow`` 35), which byte order swaps; a Kinetics
validation tree that lacks a class must keep the training labels. Each ``NAME.txt`` here is one
class name per line, line number = label (0-based), copied byte for byte from its source:

* ``ucf101`` (101): ``ucf101/label_map.txt``, UCF-101's ``classInd.txt`` (1-based there);
* ``hmdb51`` (51): ``hmdb51/label_map.txt``, the class folders sorted, as mmaction2's
  ``parse_hmdb51_split`` writes HMDB51's ``classInd.txt``;
* ``kinetics400`` / ``kinetics600`` / ``kinetics700`` (400, 600, 700):
  ``kinetics/label_map_k400.txt`` etc., the training CSV's classes sorted as mmaction2's
  ``parse_kinetics_splits`` sorts them;
* ``sthv2`` (174): ``sthv2/label_map.txt``, ``something-something-v2-labels.json`` by id;

each from open-mmlab/mmaction2 at 4d6c9347, ``tools/data/`` (``SOURCE``).

Names are matched to folder names by ``class_key``: case folded, ``"`` removed and spaces as
``_`` (mmaction2's ``rename_classnames.sh`` renames Kinetics folders so; copies of UCF-101 spell
``HandStandPushups``). No two classes of one map share a key (``tests/conversion/test_labelmaps.py``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

__all__ = ["KnownMap", "KNOWN", "known_map", "class_key", "Identified", "identify"]

_HERE = Path(__file__).resolve().parent
SOURCE = "https://github.com/open-mmlab/mmaction2/blob/4d6c93474730cad2f25e51109adcf96824efc7a3/tools/data/"


@dataclass(frozen=True)
class KnownMap:
    """One shipped label map: its ``name`` (what ``--class-index`` takes), the dataset's
    ``title``, the file it was copied from (``source``) and what that file is (``what``)."""

    name: str
    title: str
    source: str
    what: str

    @property
    def path(self) -> Path:
        """The map file inside the package."""
        return _HERE / f"{self.name}.txt"

    @property
    def classes(self) -> list[str]:
        """Class names by label."""
        return list(_read(self.name))

    def describe(self) -> str:
        """``UCF-101 (packer's built-in ucf101: classInd.txt)``: for reports and logs."""
        return f"{self.title} (packer's built-in {self.name}: {self.what})"


KNOWN: dict[str, KnownMap] = {m.name: m for m in [
    KnownMap("ucf101", "UCF-101", SOURCE + "ucf101/label_map.txt", "classInd.txt"),
    KnownMap("hmdb51", "HMDB51", SOURCE + "hmdb51/label_map.txt", "classInd.txt as mmaction2 writes it"),
    KnownMap("kinetics400", "Kinetics-400", SOURCE + "kinetics/label_map_k400.txt", "mmaction2's label_map_k400.txt"),
    KnownMap("kinetics600", "Kinetics-600", SOURCE + "kinetics/label_map_k600.txt", "mmaction2's label_map_k600.txt"),
    KnownMap("kinetics700", "Kinetics-700", SOURCE + "kinetics/label_map_k700.txt", "mmaction2's label_map_k700.txt"),
    KnownMap("sthv2", "Something-Something v2", SOURCE + "sthv2/label_map.txt",
             "something-something-v2-labels.json"),
]}


def known_map(name: str) -> Optional[KnownMap]:
    """The shipped map called ``name`` (``ucf101``, ``kinetics400``, ...), or None."""
    return KNOWN.get(name)


@functools.lru_cache(maxsize=None)
def _read(name: str) -> tuple[str, ...]:
    return tuple(line for line in (_HERE / f"{name}.txt").read_text(encoding="utf-8").split("\n") if line)


def class_key(name: str) -> str:
    """What a class name is matched by: case folded, ``"`` removed, spaces as ``_``."""
    return name.replace('"', "").replace(" ", "_").casefold()


@functools.lru_cache(maxsize=None)
def _keys(name: str) -> dict[str, int]:
    return {class_key(c): i for i, c in enumerate(_read(name))}


@dataclass(frozen=True)
class Identified:
    """What ``identify`` found: the map whose classes a tree's are (``equal``), or the maps
    whose classes hold all of the tree's and more (``within``: a validation or test tree that
    lacks some, or a tree of a few classes of it), each with the classes the tree lacks."""

    equal: Optional[KnownMap] = None
    label_of: Optional[dict[str, int]] = None  # folder name -> label, with ``equal``
    within: tuple[tuple[KnownMap, tuple[str, ...]], ...] = ()
    # neither: the map holding most of the names (at least half, and 2), with the names it lacks
    closest: Optional[tuple[KnownMap, tuple[str, ...]]] = None


def identify(names: Iterable[str]) -> Identified:
    """Which shipped map a class-folder tree's ``names`` are (see ``Identified``)."""
    names = list(names)
    keys = {class_key(n) for n in names}
    if not names or len(keys) != len(names):  # two folders one class: no map speaks for them
        return Identified()
    within, closest, shared = [], None, max(2, (len(names) + 1) // 2) - 1
    for m in KNOWN.values():
        mine = _keys(m.name)
        if not keys <= mine.keys():
            if len(keys & mine.keys()) > shared:
                shared = len(keys & mine.keys())
                closest = (m, tuple(n for n in names if class_key(n) not in mine))
            continue
        if len(keys) == len(mine):
            return Identified(equal=m, label_of={n: mine[class_key(n)] for n in names})
        lacks = tuple(c for c in _read(m.name) if class_key(c) not in keys)
        within.append((m, lacks))
    return Identified(within=tuple(within), closest=None if within else closest)
