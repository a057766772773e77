"""``--append``: which inputs an append packs into an existing output, and what its next version keeps.

An input is *in* the output when a sample of the latest version has its key, and the source
file still has the size and mtime it had when it was packed (``sources.bin``, the identity a
``--resume`` compares), with the same label. Every other input is packed, after the samples
there, in the order a fresh pack gives them (inputs that failed before are tried again). A
stored sample whose input is gone is *removed*, one whose file changed is *changed*: both are
reported and kept as they are, unless ``prune``, which leaves them out of the next version (a
changed input is then packed anew). Nothing stored is ever rewritten (docs/append.md).

What an append may not change is refused before any work, naming it: the format, an option
that changes a sample's bytes (the fingerprint's options: resize, quality, check mode, format,
extensions, shard layout), an existing label (new classes get the labels after the pack's;
a ``--class-index`` must number the pack's classes as the pack does; a ``--shuffle`` pack is
appended to with its seed, its new inputs in the order that seed's permutation of all the inputs
gives them) and a part of a split run. A field pack (``--coco``, ``--manifest``) is appended to with its grown
annotation file or manifest (``fields``): an item's label is then its identity (a digest of its
annotations or row values, ``packer.commands.pack_fields``), compared as an image's label is,
and the file's own sha256 may differ. A video output (``decode-frames``, ``pack-videos``) is appended
to video by video: a video is an input, its samples (frames, or its one stream) its stored
positions, and its manifest entry says which (``holds``).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from packer.conversion.fingerprint import COMMIT_OPTIONS, Fingerprint, item_stats, option_differences
from packer.conversion.inputs import Item, partition
from packer.errors import PackerError, UsageError
from packer.formats import Reader, open_reader
from packer.formats.versions import AppendBase, merge_ranges

__all__ = ["AppendPlan", "open_base", "plan_append", "plan_split", "PART_OPTIONS"]

log = logging.getLogger(__name__)

# created_by options that say which part of a split run a pack is, not what it holds
PART_OPTIONS = frozenset({"num_shards", "shard_index", "listing"})
# what an append need not share with the pack: that, and where a run may stop (a records shard's
# size is its own option, ``samples_per_shard``/``shard_size``)
# (and a field pack's annotation file or manifest, which an append gives grown: its samples are
# compared one by one instead, ``plan_append``)
IGNORED = PART_OPTIONS | COMMIT_OPTIONS | {"source_sha256"}
_KEY, _LABEL = attrgetter("key"), attrgetter("label")


@dataclass
class AppendPlan:
    """What an append does: pack ``items`` after the samples of ``base``'s version, under
    ``classes``; ``removed`` and ``changed`` name the stored samples whose inputs are gone or
    changed (left out of the next version when ``prune``)."""

    base: AppendBase
    items: list[Item]
    classes: list[str]
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    prune: bool = False
    by_key: bool = False  # the pack recorded no input sizes and times: stored inputs matched by key

    @property
    def new_classes(self) -> list[str]:
        return self.classes[len(self.base.manifest.classes):]

    @property
    def empty(self) -> bool:
        """Nothing to pack and nothing to leave out: no new version."""
        return not self.items and not (self.prune and (self.removed or self.changed))

    def base_identity(self) -> dict[str, Any]:
        """Which published version the append continues (a resume must continue the same)."""
        m = self.base.manifest
        return {"version": m.version, "identity": m.identity(), "stored": self.base.stored}

    def note(self) -> str:
        """What the report says of the append besides its counts."""
        parts = []
        if self.new_classes:
            shown = ", ".join(self.new_classes[:3]) + (", ..." if len(self.new_classes) > 3 else "")
            parts.append(f"{len(self.new_classes)} new classes ({shown}) labelled from "
                         f"{len(self.base.manifest.classes)}")
        for what, keys in (("gone", self.removed), ("changed since they were packed", self.changed)):
            if keys:
                fate = "left out of this version" if self.prune else "kept (--prune leaves them out)"
                parts.append(f"{len(keys)} stored inputs {what}, {fate}, e.g. {keys[0]}")
        if self.by_key:
            parts.append("the pack records no input sizes and times: stored inputs matched by key only")
        return "; ".join(parts)

    def fingerprint(self, fp: dict[str, Any]) -> dict[str, Any]:
        """The published version's fingerprint: the append run's (its options, the classes, the
        inputs it packed), with the inputs of the version it continued as ``parent`` (a chain:
        O(new inputs), not a pass over every stored one)."""
        parent = self.base.manifest.fingerprint.get("inputs") if self.base.manifest.fingerprint else None
        return {**fp, "inputs": {**fp["inputs"], "parent": parent,
                                 "appended_to": {"version": self.base.manifest.version,
                                                 "count": len(self.base.reader)}}}


_HOLDS = {"images": ("images", "to-{}"), "frames": ("video frames (decode-frames)", "decode-frames --to {}"),
          "videos": ("videos (pack-videos)", "pack-videos --to {}")}


def _refuse_kind(out: Path, reader: Reader, format: str, holds: str = "images", fields: bool = False) -> None:
    m = reader.manifest
    options = m.created_by.get("options") or {}
    held = m.holds if m.kind != "videos" or m.videos else holds  # (no video stored: either kind)
    if held != holds:
        raise UsageError(f"{out}: holds {_HOLDS[held][0]}, not {_HOLDS[holds][0]}; append to it with "
                         + _HOLDS[held][1].format(m.format))
    if m.format != format:
        raise UsageError(f"{out}: is a {m.format} output; append to it with " + _HOLDS[holds][1].format(m.format))
    if bool(m.schema) != fields:
        raise UsageError(f"{out}: is a field pack; append to it with --coco or --manifest, as it was made"
                         if m.schema else f"{out}: holds {_HOLDS[held][0]}, not the samples of --coco or --manifest")
    if int(options.get("num_shards") or 1) > 1:
        raise UsageError(f"{out}: is part {options.get('shard_index')} of a split run (--num-shards "
                         f"{options.get('num_shards')}); merge the parts, then append to the merged output")


def _check_options(out: Path, reader: Reader, format: str, options: dict[str, Any]) -> None:
    """UsageError naming every option that differs from the pack's (what decides the bytes)."""
    def flat(opts: dict[str, Any]) -> dict[str, Any]:
        got = Fingerprint(format=format, classes=[], options=opts, stats=[]).options
        # (a merged records output repeats its writer's options at the top: compared once)
        return {k: v for k, v in got.items() if k.rsplit(".", 1)[-1] not in IGNORED and f"writer.{k}" not in got}

    diff = option_differences(flat(reader.manifest.created_by.get("options") or {}), flat(options))
    if diff:
        raise UsageError(f"{out}: cannot append, this run's options differ from the pack's:\n  " + "\n  ".join(diff)
                         + "\n(give the options the pack was made with; packer inspect shows them)")


def _classes(out: Path, old: list[str], classes: Sequence[str], items: Sequence[Item],
             listed: bool, indexed: bool) -> tuple[list[str], list[Item]]:
    """The next version's classes and the items labelled by them: the pack's labels never change;
    a class the pack lacks gets the next label (in sorted order), or the given label map's."""
    if listed:  # a list gives its own labels: the classes are "0".."max label"
        n = max([len(old)] + [it.label + 1 for it in items])
        return list(old) + [str(i) for i in range(len(old), n)], list(items)
    if indexed:  # --class-index: its numbering, which must agree with the pack's
        for i, name in enumerate(old):
            if i >= len(classes) or classes[i] != name:
                got = classes[i] if i < len(classes) else "no class"
                raise UsageError(f"{out}: the --class-index gives label {i} to {got!r}, the pack to {name!r}; "
                                 "an existing label never changes")
        return list(classes), list(items)
    known = {name: i for i, name in enumerate(old)}
    fresh = sorted(name for name in set(classes) if name not in known)
    label_of = {**known, **{name: len(old) + k for k, name in enumerate(fresh)}}
    relabel = [label_of[name] for name in classes]
    if relabel == list(range(len(relabel))):  # (the usual case: no item's label changes, no pass)
        return list(old) + fresh, list(items)
    return list(old) + fresh, [it if relabel[it.label] == it.label else _relabelled(it, relabel[it.label])
                               for it in items]


def _relabelled(item: Item, label: int) -> Item:
    """``item`` with ``label`` (a video's other fields kept)."""
    return Item(item.key, item.path, label) if type(item) is Item else dataclasses.replace(item, label=label)


def _units(reader: Reader, holds: str) -> tuple[Sequence[str], list[int], dict[str, list[int]] | None]:
    """The inputs the version holds: (their keys, the stored position of each one's first sample,
    for videos each one's stored positions by key; None for images: one sample an input)."""
    positions = reader.positions()
    if holds == "images":
        return reader.keys, positions.tolist(), None
    spans = {str(v["key"]): positions[int(v["start"]):int(v["start"]) + int(v["length"])].tolist()
             for v in reader.manifest.videos}
    return list(spans), [s[0] if s else -1 for s in spans.values()], spans


def open_base(out: str | os.PathLike) -> tuple[Reader, str]:
    """The output an append continues: its latest version open, and that version's manifest
    text as published (``AppendBase``); UsageError when it cannot be read."""
    try:
        reader = open_reader(out)
        return reader, reader.manifest_text()
    except PackerError as e:
        raise UsageError(f"{out}: cannot append to it ({e})") from e


def plan_append(out: str | os.PathLike, items: Sequence[Item], classes: Sequence[str], *, format: str,
                options: dict[str, Any], prune: bool = False, listed: bool = False,
                holds: str = "images", fields: bool = False) -> AppendPlan:
    """What appending ``items`` (a fresh pack's inputs, labelled by ``classes``) to the output at
    ``out`` does: refuses what an append may not change (see the module docstring); ``options``
    are the run's ``created_by`` options, ``listed`` says the items come from a list file,
    ``holds`` what a sample is (``Manifest.holds``: ``frames`` and ``videos`` take video items);
    ``fields``: a field pack's items (their ``label`` their identity), ``classes`` already the
    pack's grown (``packer.commands.pack_fields``)."""
    out = Path(out)
    reader, text = open_base(out)
    _refuse_kind(out, reader, format, holds, fields)
    _check_options(out, reader, format, options)
    indexed = getattr(classes, "label_map", None) not in (None, "sorted", "list")
    new_classes, items = ((list(classes), list(items)) if fields
                          else _classes(out, reader.classes, classes, items, listed, indexed))
    keys, firsts, spans = _units(reader, holds)
    table = reader.sources()
    stored = dict(zip(keys, firsts))
    # (in C loops over the items, which may be millions: no Python object made per item twice)
    at = np.fromiter(map(stored.get, map(_KEY, items), repeat(-1)), dtype=np.int64, count=len(items))
    found = np.flatnonzero(at >= 0)
    is_changed = np.zeros(len(items), dtype=bool)
    if table is not None and len(found):  # the identity --resume compares: size, mtime, label
        there = [items[i] for i in found.tolist()]
        now = item_stats(there)
        then = table[at[found]]
        labels = np.fromiter(map(_LABEL, there), dtype=np.int64, count=len(there))
        is_changed[found] = (then[:, 0] != now[:, 0]) | (then[:, 1] != now[:, 1]) | (then[:, 2] != labels)
    changed = [items[i].key for i in np.flatnonzero(is_changed).tolist()]
    packed = at < 0
    if prune:
        packed |= is_changed
    todo = [items[i] for i in np.flatnonzero(packed).tolist()]
    removed: list[str] = []
    if len(found) < len(keys):  # (every stored input still there: the usual case, no pass)
        seen = {items[i].key for i in found.tolist()}
        removed = [k for k in keys if k not in seen]
    keep = None
    drop: set[int] = set()
    if prune and (removed or changed):
        drop = ({stored[k] for k in removed + changed} if spans is None
                else {p for k in removed + changed for p in spans[k]})
        keep = merge_ranges([[p, p + 1] for p in reader.positions().tolist() if p not in drop])
    base = AppendBase(reader, text, keep=keep,
                      removed={"samples": len(drop), "gone": removed[:20], "changed": changed[:20]}
                      if keep is not None else {})
    return AppendPlan(base, todo, new_classes, removed=removed, changed=changed, prune=prune,
                      by_key=table is None)


def plan_split(append_to: str | os.PathLike, every: Sequence[Item], classes: Sequence[str], *, format: str,
               options: dict[str, Any], num_shards: int, shard_index: int, listed: bool = False,
               holds: str = "images", fields: bool = False,
               check: Callable[[AppendPlan], None] | None = None) -> tuple[list[Item], list[str], dict[str, Any]]:
    """One job of a split append (docs/append.md, "Split appends"): every job plans appending
    ``every`` input to ``append_to`` as ``plan_append`` does, and packs share ``shard_index`` of
    ``num_shards`` of it. Returns that share, the grown classes, and what the part records of the
    version planned against (``created_by.options.append_to``, which ``merge --append``
    compares). ``check(plan)`` refuses what this kind of output may not take."""
    split = plan_append(append_to, every, classes, format=format, listed=listed, holds=holds, fields=fields,
                        options={k: v for k, v in options.items() if k != "listing"})
    try:
        if check is not None:
            check(split)
        record = {"path": str(Path(append_to).resolve()), **split.base_identity()}
    finally:
        split.base.reader.close()
    return partition(split.items, num_shards, shard_index), list(split.classes), record
