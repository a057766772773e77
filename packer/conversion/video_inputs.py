"""Walk video inputs into ``VideoItem``s: UCF-101/HMDB51/Kinetics class folders, flat folders,
the Kinetics CSV and mmaction2 video lists (each with its frame folder ``{class}/{video}``).

The shared rules (sorted keys, hidden files skipped, no symlinked folders, list paths kept
inside their root, bad lines recorded as input failures) are ``packer.conversion.inputs``'.
"""
from __future__ import annotations

import csv
import dataclasses
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from packer.conversion import lists
from packer.conversion.labelmaps import identify
from packer.conversion.input_failures import InputFailure, bad_line
from packer.conversion.inputs import (DEFAULT_VIDEO_EXTS, Item, class_files, has_ext, parse_exts, safe_key,
                                     top_level, walk_files)
from packer.errors import UsageError

__all__ = ["VideoItem", "video_items", "video_folder", "folder_classes", "kinetics_csv", "video_list",
           "read_class_index"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VideoItem(Item):
    """A video input plus its frame folder, relative to the output (``{class}/{video}``)."""

    frame_dir: str = ""
    labels: tuple[int, ...] = ()  # every label of a multi-label list line (label is the first)


_SPACE = re.compile(r"\s+")


def _dir_part(name: str) -> str:
    # mmaction2 splits list lines on whitespace, so a frame_dir may not contain any.
    return _SPACE.sub("_", name.strip())


def _with_frame_dirs(entries: Sequence[tuple[str, str, int, str]], where: str) -> list[VideoItem]:
    """(key, path, label, output folder) -> VideoItems with ``{folder}/{stem}`` frame dirs.

    Two videos with the same stem in one folder both use ``{stem}_{ext}`` (DESIGN: frames).
    """
    def split(key: str) -> tuple[str, str]:
        name = key.rsplit("/", 1)[-1]
        stem, dot, ext = name.rpartition(".")
        return (_dir_part(stem), _dir_part(ext)) if dot and stem else (_dir_part(name), "")

    groups: dict[tuple[str, str], int] = {}
    for key, _, _, folder in entries:
        k = (folder, split(key)[0])
        groups[k] = groups.get(k, 0) + 1
    items, seen = [], {}
    for key, path, label, folder in entries:
        stem, ext = split(key)
        name = f"{stem}_{ext}" if groups[(folder, stem)] > 1 and ext else stem
        frame_dir = f"{folder}/{name}" if folder else name
        if frame_dir in seen:
            raise UsageError(f"{where}: {seen[frame_dir]!r} and {key!r} both map to frame folder "
                             f"{frame_dir!r}; rename one of them")
        seen[frame_dir] = key
        items.append(VideoItem(key, path, label, frame_dir))
    for frame_dir, key in seen.items():  # a frame folder holds frame files only
        parts = frame_dir.split("/")
        for k in range(1, len(parts)):
            outer = "/".join(parts[:k])
            if outer in seen:
                raise UsageError(f"{where}: frame folder of {key!r} would lie inside the frame "
                                 f"folder of {seen[outer]!r}; rename one of them")
    return items


def read_class_index(path: str | os.PathLike) -> list[str]:
    """Class names by label from ``classInd.txt`` (``1 ApplyEyeMakeup`` lines), a label map (one
    name per line) or a Kinetics training CSV (see ``packer.conversion.lists``)."""
    return lists.read_class_index(path).classes


def _index(class_index: str | os.PathLike | None) -> Optional[lists.ClassIndex]:
    return lists.read_class_index(class_index, tree=_training_tree) if class_index is not None else None


def _training_tree(root: Path) -> list[str]:
    """The classes of a training class-folder tree given as ``--class-index``, numbered as
    ``folder_classes`` numbers that tree."""
    return folder_classes(top_level(root, DEFAULT_VIDEO_EXTS)[0], None, str(root), None)[0]


def _lacking(lacks: Sequence[str]) -> str:
    return ", ".join(lacks[:3]) + (f" and {len(lacks) - 3} more" if len(lacks) > 3 else "")


def folder_classes(names: Sequence[str], index: Optional[lists.ClassIndex], where: str,
                   class_index: str | os.PathLike | None) -> tuple[lists.Classes, dict[str, int]]:
    """(classes, folder name -> label) of a class-folder tree whose folders are ``names``:

    * with ``index`` (``--class-index``), its numbering; a folder it lacks is refused;
    * the label map of the dataset whose classes the folders are (``labelmaps.identify``:
      UCF-101's ``classInd.txt``, Kinetics' label maps, ...), as mmaction2 numbers it;
    * refused when the folders are a proper subset of such a dataset's classes (a validation
      or test tree, numbered on its own, would shift every label after a missing class);
    * otherwise the folder names in mmaction2's order (sorted with spaces as ``_``: byte
      order for names without spaces), and the report says so.
    """
    if index is not None:
        return lists.Classes.of_index(index), lists.labels_of(names, index, where, class_index)[1]
    found = identify(names)
    if found.equal is not None:
        m = found.equal
        return (lists.Classes(m.classes, label_map=m.name,
                              note=f"the class folders are {m.title}'s {len(names)} classes: numbered by "
                                   f"{m.describe()}"), found.label_of or {})
    if found.within:
        of = "; ".join(f"{m.title}'s {len(m.classes)} (lacking {_lacking(lacks)})" for m, lacks in found.within)
        first = found.within[0][0]
        raise UsageError(f"{where}: the {len(names)} class folders are a part of the classes of {of}. "
                         "A validation or test tree is numbered from the training classes, or every label "
                         f"after a missing class shifts: give them with --class-index ({first.name} for "
                         f"packer's copy of {first.what}, a label map, classInd.txt or the training CSV); "
                         "a dataset of its own takes a file of its class names in label order")
    classes = lists.Classes(lists.mmaction2_order(names), label_map="sorted")
    classes.note = (f"{len(classes)} class folders of no dataset packer knows, numbered in sorted order "
                    f"(byte order, spaces as _): {classes.first_labels()}")
    if found.closest is not None:
        m, strangers = found.closest
        log.warning("%s: %d of the %d class folders are %s classes, but not %s: numbered in sorted order, "
                    "not as %s", where, len(names) - len(strangers), len(names), m.title, _lacking(strangers),
                    m.describe())
    return classes, {n: i for i, n in enumerate(classes)}


def video_folder(root: str | os.PathLike, exts: Sequence[str] = DEFAULT_VIDEO_EXTS, *,
                 class_index: str | os.PathLike | None = None,
                 failures: list[InputFailure] | None = None) -> tuple[list[VideoItem], list[str]]:
    """UCF-101 / HMDB51 / Kinetics class folders ``root/<class>/<video>``: labels as
    ``folder_classes`` gives them (``class_index``, the dataset's own label map, or sorted
    names; a part of a known dataset's classes is refused without ``class_index``). A flat
    folder of videos (mmaction2's ``--level 1``) gives label -1 and no classes. A file name
    that cannot be a key goes to ``failures``. The classes are a ``lists.Classes``."""
    root = Path(root)
    names, loose = top_level(root, exts)
    if not names and not loose:
        raise UsageError(f"{root}: no class folders and no videos (expected ROOT/<class>/<video>, "
                         "ROOT/<video>, or --csv/--list)")
    if not names:
        log.warning("%s: no class folders: %d videos packed with label -1 (unlabelled)", root, len(loose))
        entries = [(safe_key(name, str(root)), str(root / name), -1, "") for name in loose]
        return _with_frame_dirs(entries, str(root)), lists.Classes(note="no class folders: every video has label -1")
    for name in loose:  # not a documented filter: each one is recorded (or refused without a list)
        bad_line(failures, str(root), 0, f"{name}: a video beside the class folders belongs to no class", name)
    classes, label_of = folder_classes(names, _index(class_index), str(root), class_index)
    entries = []
    for cls in names:
        for key, rel in class_files(root, cls, exts, failures):
            folder = "/".join(_dir_part(p) for p in key.split("/")[:-1])
            entries.append((key, str(root / cls / rel), label_of[cls], folder))
    entries.sort(key=lambda e: (e[2], e[0]))
    return _with_frame_dirs(entries, str(root)), classes


def kinetics_csv(csv_path: str | os.PathLike, root: str | os.PathLike,
                 exts: Sequence[str] = DEFAULT_VIDEO_EXTS, *,
                 class_index: str | os.PathLike | None = None,
                 failures: list[InputFailure] | None = None) -> tuple[list[VideoItem], list[str]]:
    """The official Kinetics CSV (``label,youtube_id,time_start,time_end,split``) over the
    videos below ``root`` (flat or in class folders), named as the Kinetics downloader writes
    them (``{youtube_id}_{start:06d}_{end:06d}.mp4``) or plainly ``{youtube_id}.mp4``.

    Classes come from ``class_index`` (a label map, ``classInd.txt`` or the training CSV), or
    from this CSV when it is a training CSV (in mmaction2's order); a validation or test CSV
    alone is refused (it may miss classes, shifting every label). A CSV without a ``label``
    column (the test split) gives label -1. A row whose video is not found stays an item (its
    decode fails as ``file not found``, so missing downloads are counted in ``failures.jsonl``).
    """
    csv_path, root = Path(csv_path), Path(root)
    if not csv_path.is_file():
        raise UsageError(f"{csv_path}: CSV file does not exist")
    if not root.is_dir():
        raise UsageError(f"{root}: input folder does not exist")
    by_stem: dict[str, str] = {}
    for rel in sorted(walk_files(root, failures, exts)):
        if has_ext(rel, exts):
            by_stem.setdefault(Path(rel).stem, rel)
    with open(csv_path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        need = {"youtube_id", "time_start", "time_end"}
        fields = {n.strip() for n in reader.fieldnames or []}
        if not need <= fields:
            raise UsageError(f"{csv_path}: expected the Kinetics header "
                             f"'label,youtube_id,time_start,time_end,split', got {reader.fieldnames}")
        labelled = "label" in fields
        rows, splits = [], set()
        for lineno, row in enumerate(reader, 2):
            row = {k.strip(): (v or "").strip() for k, v in row.items() if k}
            try:
                start, end = int(float(row["time_start"])), int(float(row["time_end"]))
            except (ValueError, TypeError, KeyError):
                bad_line(failures, str(csv_path), lineno, "time_start/time_end are not numbers",
                          row.get("youtube_id") or "")
                continue
            if not row["youtube_id"] or (labelled and not row["label"]):
                bad_line(failures, str(csv_path), lineno, "empty label or youtube_id", row.get("youtube_id") or "")
                continue
            splits.add(row.get("split", "").lower())
            rows.append((row["label"] if labelled else None, row["youtube_id"], start, end, lineno))
    index = _index(class_index)
    if labelled and index is None and splits - {"train", ""}:
        raise UsageError(f"{csv_path}: a {'/'.join(sorted(splits - {'train', ''}))} CSV may miss classes, "
                         "which would shift every label: give the classes with --class-index "
                         "(kinetics400/600/700: packer's copies of mmaction2's label maps; a label map "
                         "file, or the training CSV)")
    if labelled and index is not None:
        classes = lists.Classes.of_index(index)
        label_of = lists.labels_of((r[0] for r in rows), index, str(csv_path), class_index)[1]
    elif labelled:
        classes, label_of = _csv_classes({r[0] for r in rows})
    else:
        log.warning("%s: no label column: every video gets label -1", csv_path)
        classes = lists.Classes.of_index(index) if index is not None else lists.Classes()
        classes.note, label_of = "no label column: every video has label -1", {}
    entries, seen = [], set()
    for label, yid, start, end, lineno in rows:
        clip = f"{yid}_{start:06d}_{end:06d}"
        rel = by_stem.get(clip) or by_stem.get(yid) or f"{clip}.mp4"
        try:
            key = safe_key(rel, str(csv_path))
        except UsageError as e:
            bad_line(failures, str(csv_path), lineno, str(e).removeprefix(f"{csv_path}: "), yid)
            continue
        if key in seen:
            bad_line(failures, str(csv_path), lineno, f"{key} is listed more than once (kept the first)", key)
            continue
        seen.add(key)
        entries.append((key, str(root / rel), label_of.get(label, -1), _dir_part(label) if label else ""))
    entries.sort(key=lambda e: (e[2], e[0]))
    return _with_frame_dirs(entries, str(csv_path)), classes


def _csv_classes(names: set[str]) -> tuple[lists.Classes, dict[str, int]]:
    """A training CSV's classes: a known dataset's label map when they are its classes (the
    same order: mmaction2 sorts the training CSV's names to make it), else sorted as mmaction2."""
    found = identify(names)
    if found.equal is not None:
        m = found.equal
        return (lists.Classes(m.classes, label_map=m.name, note=f"the CSV's classes are {m.title}'s: "
                                                                 f"numbered by {m.describe()}"),
                found.label_of or {})
    classes = lists.Classes(lists.mmaction2_order(names), label_map="sorted")
    classes.note = f"{len(classes)} classes of the CSV in mmaction2's order: {classes.first_labels()}"
    return classes, {n: i for i, n in enumerate(classes)}


def video_list(list_path: str | os.PathLike, root: str | os.PathLike,
               exts: Sequence[str] | None = None, *,
               class_index: str | os.PathLike | None = None,
               failures: list[InputFailure] | None = None) -> tuple[list[VideoItem], list[str]]:
    """An mmaction2 video list (paths relative to ``root``; order kept): ``path label``,
    ``path l1 l2 ...`` (multi-label) or ``path`` (no label: -1, or with ``class_index`` the
    class of its folder, as UCF-101's ``testlist01.txt``). With ``class_index`` the labels are
    in its numbering (``classInd.txt``: 1-based, as UCF-101's ``trainlist01.txt``) and become
    0-based; a label that disagrees with the line's class folder is refused. Any other line
    that cannot be an item (unparsable, an unsafe path, another extension, repeated) goes to
    ``failures`` (see ``InputFailure``)."""
    list_path = Path(list_path)
    if not list_path.is_file():
        raise UsageError(f"{list_path}: list file does not exist")
    if not Path(root).is_dir():
        raise UsageError(f"{root}: root folder does not exist")
    index = _index(class_index)
    entries, labels_by_key, seen = [], {}, set()
    for lineno, line in enumerate(lists.read_lines(list_path, "list file"), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{list_path}:{lineno}"
        try:
            parsed = lists.parse_list_line(line, where)
            key = safe_key(parsed.path, where)
        except UsageError as e:
            bad_line(failures, str(list_path), lineno, str(e).removeprefix(where + ": "))
            continue
        if exts is not None and not has_ext(key, exts):
            bad_line(failures, str(list_path), lineno,
                      f"{key!r} does not end in one of the extensions taken ({', '.join(exts)})", key)
            continue
        if key in seen:
            bad_line(failures, str(list_path), lineno, f"{key!r} is listed twice", key)
            continue
        # a label that contradicts its class folder means the numbering is off (a wrong class
        # index), not one bad line: that stays a refusal of the whole run
        labels = lists.line_labels(parsed.labels, key, index, where)
        seen.add(key)
        if len(labels) > 1:
            labels_by_key[key] = labels
        entries.append((key, str(Path(root) / key), labels[0],
                        "/".join(_dir_part(p) for p in key.split("/")[:-1])))
    if index is not None:
        classes = lists.Classes.of_index(index)
    else:
        if entries and min(e[2] for e in entries) == 1:
            log.warning("%s: labels start at 1; if they are 1-based (UCF-101's trainlist), pass "
                        "--class-index classInd.txt, or every label is one too high", list_path)
        n = max((x for e in entries for x in labels_by_key.get(e[0], (e[2],))), default=-1) + 1
        classes = lists.Classes([str(i) for i in range(n)], label_map="list",
                                note=f"labels as the list numbers them (0..{n - 1}; no class names)")
    items = _with_frame_dirs(entries, str(list_path))
    return [dataclasses.replace(it, labels=labels_by_key[it.key]) if it.key in labels_by_key else it
            for it in items], classes


def video_items(src: str | os.PathLike, *, list_path: str | os.PathLike | None = None,
                csv_path: str | os.PathLike | None = None,
                class_index: str | os.PathLike | None = None,
                exts: str | Sequence[str] | None = None,
                failures: list[InputFailure] | None = None) -> tuple[list[VideoItem], list[str]]:
    """Items of a video dataset: class folders under ``src``, the Kinetics ``csv_path`` over
    ``src``, or the mmaction2 video list ``list_path`` relative to ``src``. Unusable lines go
    to ``failures`` (see ``InputFailure``)."""
    exts = parse_exts(exts, DEFAULT_VIDEO_EXTS)
    if list_path is not None and csv_path is not None:
        raise UsageError("--list and --csv exclude each other")
    if list_path is not None:
        return video_list(list_path, src, exts, class_index=class_index, failures=failures)
    if csv_path is not None:
        return kinetics_csv(csv_path, src, exts, class_index=class_index, failures=failures)
    return video_folder(src, exts, class_index=class_index, failures=failures)
