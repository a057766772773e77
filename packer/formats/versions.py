"""Versions of a packed output: what an ``--append`` continues and the manifest it publishes.

Storage only grows (docs/append.md): an append stores its samples after the ones there, at new
*stored positions*, and publishes the next version's manifest, a selection of stored positions
(``Manifest.ranges``). A version never changes once published, so a reader opened on it keeps
reading it: its manifest stays readable (``versions/{n}.json`` in a folder output, an attribute
of the HDF5 head file), and every sidecar a later version rewrites (``keys.json``,
``checksums.bin``, ``sources.bin``) only grows, the same for the positions an earlier version
holds.

``AppendBase`` is the published version an append starts from (its reader, and which of its
stored positions the next version keeps); ``next_version`` builds the next version's manifest
from the new samples' own manifest. The formats' writers store the new samples and publish
(``Writer._close_appended``); ``packer.conversion.append`` decides what to add and keep.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from packer.formats.sidecars import array_checksum, keys_checksum
from packer.manifest import MANIFEST_NAME, VERSIONS_DIR, Manifest, atomic_write_bytes

if TYPE_CHECKING:
    import numpy as np

    from packer.formats.reader import Reader

__all__ = ["AppendBase", "next_version", "next_videos", "merge_ranges", "version_path", "summary", "save_versions", "video_index", "next_video_index",
           "keep_base"]


def version_path(out: str | os.PathLike, version: int) -> Path:
    """Where a folder output keeps the manifest of ``version``: ``versions/{version}.json``."""
    return Path(out) / VERSIONS_DIR / f"{version}.json"


def merge_ranges(ranges: Sequence[Sequence[int]]) -> list[list[int]]:
    """``[start, stop)`` ranges in order with the empty ones dropped and touching ones joined."""
    out: list[list[int]] = []
    for a, b in ranges:
        if b <= a:
            continue
        if out and out[-1][1] == a:
            out[-1][1] = int(b)
        else:
            out.append([int(a), int(b)])
    return out


def summary(m: Manifest) -> dict[str, Any]:
    """What a later version's ``history`` says of version ``m``: its number, parent, count,
    what it added and removed, its command and its ``identity()`` (a reader of it checks that)."""
    entry: dict[str, Any] = {"version": m.version, "count": m.count, "identity": m.identity()}
    if m.parent is not None:
        entry["parent"] = m.parent
    if m.stored:
        entry["stored"] = m.stored
    for name in ("added", "removed"):
        if getattr(m, name):
            entry[name] = getattr(m, name)
    command = m.created_by.get("command")
    if command:
        entry["command"] = command
    return entry


@dataclass
class AppendBase:
    """The published version an append continues.

    Args:
        reader: the output's latest version, open.
        text: that version's manifest exactly as published (kept as its ``versions/{n}.json``).
        keep: the stored ranges of it the next version keeps (None: all of its samples).
        removed: what the next version leaves out, for its manifest (``{"samples": n, ...}``).
    """

    reader: "Reader"
    text: str
    keep: list[list[int]] | None = None
    removed: dict[str, Any] = field(default_factory=dict)

    @property
    def manifest(self) -> Manifest:
        return self.reader.manifest

    @property
    def stored(self) -> int:
        """Stored positions the output holds at the base version: an append stores after them."""
        return self.manifest.physical

    def stored_keys(self) -> list[str]:
        """The key of every stored position of the base version."""
        return list(self.reader.stored_keys())

    def kept(self) -> list[list[int]]:
        return [list(r) for r in self.manifest.ranges()] if self.keep is None else self.keep


def next_version(base: AppendBase, added: Manifest, *, keys: Sequence[str], sources: "np.ndarray | None",
                 extra_added: dict[str, Any] | None = None) -> Manifest:
    """The manifest of the version after ``base`` that stores ``added``'s samples after the base's
    stored positions. ``added``: the new samples' own manifest (count, classes, created_by,
    failures, fingerprint: the append run's); ``keys``: every stored position's key after the
    append; ``sources``: every stored position's row (``sources.bin``) or None. A format adds
    its own fields (``shards``, ``parts``, more ``integrity``) to the result."""
    old = base.manifest
    stored = base.stored + added.count
    select = merge_ranges(base.kept() + [[base.stored, stored]])
    count = sum(b - a for a, b in select)
    chosen = keys if select == [[0, stored]] else [keys[p] for a, b in select for p in range(a, b)]
    integrity = {"keys": keys_checksum(chosen)}
    if sources is not None:
        integrity["sources"] = array_checksum(sources[:stored], "<i8")
    what: dict[str, Any] = {"samples": [base.stored, stored]} if added.count else {}
    new_classes = added.classes[len(old.classes):]
    if new_classes:
        what["classes"] = list(new_classes)
    what.update(extra_added or {})
    return dataclasses.replace(
        added, count=count, fields=list(old.fields), extra={**old.extra, **added.extra}, integrity=integrity,
        version=old.version + 1, parent=old.version, stored=stored,
        select=[] if select == [[0, stored]] else select, added=what, removed=dict(base.removed),
        history=[*old.history, summary(old)], shards=[], videos=next_videos(base, added.videos, count - added.count),
        parts=[])


def video_index(videos: Sequence[dict[str, Any]], position: int) -> int:
    """The ``video_index`` the samples of ``videos[position]`` store (a records output's
    ``video/index``): its ``index`` where a ``--prune`` moved it, else its position."""
    return int(videos[position].get("index", position))


def next_video_index(videos: Sequence[dict[str, Any]]) -> int:
    """The ``video_index`` an append's first new video takes: one past every one the version's
    samples store, so that none is taken twice, even after a ``--prune`` left videos out."""
    return max((video_index(videos, i) for i in range(len(videos))), default=-1) + 1


def next_videos(base: AppendBase, added: Sequence[dict[str, Any]], kept: int) -> list[dict[str, Any]]:
    """The ``videos`` entries of the version after ``base``: the base version's that it keeps,
    then ``added`` (the new samples' own, ``start`` counted from their first), each ``start`` a
    sample position of the new version; ``kept``: how many of the base's samples it keeps. An
    entry whose samples store another ``video_index`` than its new position says which
    (``index``): a ``--prune`` moves entries up, and the new ones are numbered after every
    index the base's samples store (``next_video_index``), as the runner numbers them."""
    if not base.manifest.videos and not added:
        return []
    first_new = next_video_index(base.manifest.videos)
    videos = [{**v, "index": video_index(base.manifest.videos, i)} for i, v in enumerate(base.manifest.videos)]
    if base.keep is not None and videos:  # a --prune: the videos wholly kept, their starts moved up
        import numpy as np

        starts = np.cumsum([0] + [b - a for a, b in base.keep], dtype=np.int64)
        firsts = np.array([a for a, _ in base.keep] or [0], dtype=np.int64)
        stops = np.array([b for _, b in base.keep] or [0], dtype=np.int64)
        positions = base.reader.positions()
        moved = []
        for v in videos:
            p = int(positions[int(v["start"])])
            k = int(firsts.searchsorted(p, side="right")) - 1
            if k >= 0 and p < stops[k]:
                moved.append({**v, "start": int(starts[k] + p - firsts[k])})
        videos = moved
    videos += [{**v, "start": int(v["start"]) + kept, "index": first_new + j} for j, v in enumerate(added)]
    for i, v in enumerate(videos):  # (the usual case, nothing moved: no entry carries one)
        if v["index"] == i:
            del v["index"]
    return videos


def keep_base(out: Path, base: AppendBase) -> None:
    """Keep the base version's manifest as published in ``versions/`` before anything of the
    output grows: a ``versions/`` folder says that sidecars may hold later positions."""
    folder = out / VERSIONS_DIR
    folder.mkdir(exist_ok=True)
    kept = version_path(out, base.manifest.version)
    if not kept.is_file():
        atomic_write_bytes(kept, base.text.encode("utf-8"))


def save_versions(out: Path, base: AppendBase, version: Manifest) -> None:
    """Keep the new version's manifest in ``versions/`` (the base's too), then publish it (the
    atomic replace of ``packer.json``: the moment the version exists)."""
    keep_base(out, base)
    text = version.to_json().encode()
    atomic_write_bytes(version_path(out, version.version), text)
    atomic_write_bytes(out / MANIFEST_NAME, text)
