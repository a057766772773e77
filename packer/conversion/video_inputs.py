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
from packer.conversion.input_failures import InputFailure, bad_line
from packer.conversion.inputs import (DEFAULT_VIDEO_EXTS, Item, class_files, has_ext, parse_exts, safe_key,
                                     top_level, walk_files)
from packer.errors import UsageError

__all__ = ["VideoItem", "video_items", "video_folder", "kinetics_csv", "video_list", "read_class_index"]

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
    return lists.read_class_index(class_index) if class_index is not None else None


def video_folder(root: str | os.PathLike, exts: Sequence[str] = DEFAULT_VIDEO_EXTS, *,
                 class_index: str | os.PathLike | None = None,
                 failures: list[InputFailure] | None = None) -> tuple[list[VideoItem], list[str]]:
    """UCF-101 / HMDB51 / Kinetics class folders ``root/<class>/<video>``: labels from the class
    folders in mmaction2's order (sorted with spaces as ``_``), or from ``class_index``
    (``classInd.txt`` or a label map). A flat folder of videos (mmaction2's ``--level 1``)
    gives label -1 and no classes. A file name that cannot be a key goes to ``failures``."""
    root = Path(root)
    names, loose = top_level(root, exts)
    if not names and not loose:
        raise UsageError(f"{root}: no class folders and no videos (expected ROOT/<class>/<video>, "
                         "ROOT/<video>, or --csv/--list)")
    if not names:
        log.warning("%s: no class folders: %d videos packed with label -1 (unlabelled)", root, len(loose))
        entries = [(safe_key(name, str(root)), str(root / name), -1, "") for name in loose]
        return _with_frame_dirs(entries, str(root)), []
    for name in loose:  # not a documented filter: each one is recorded (or refused without a list)
        bad_line(failures, str(root), 0, f"{name}: a video beside the class folders belongs to no class", name)
    classes, label_of = lists.labels_of(names, _index(class_index), str(root), class_index)
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
                         "(mmaction2's label_map_k400.txt, or the training CSV)")
    if labelled:
        classes, label_of = lists.labels_of((r[0] for r in rows), index, str(csv_path), class_index)
    else:
        log.warning("%s: no label column: every video gets label -1", csv_path)
        classes, label_of = (index.classes if index is not None else []), {}
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
        classes = index.classes
    else:
        if entries and min(e[2] for e in entries) == 1:
            log.warning("%s: labels start at 1; if they are 1-based (UCF-101's trainlist), pass "
                        "--class-index classInd.txt, or every label is one too high", list_path)
        n = max((x for e in entries for x in labels_by_key.get(e[0], (e[2],))), default=-1) + 1
        classes = [str(i) for i in range(n)]
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
