"""``packer merge PART... OUT``: combine the parts of a sharded conversion into one dataset.

A conversion split with ``--num-shards N --shard-index I`` writes N parts, each a complete
packed output of one contiguous block of the sorted input. Merging them in shard order gives
what one machine would have written over the whole input: the same positions, keys, labels,
bytes, classes and ``failures.jsonl`` (unusable input lines are the run's: part 0 records
them, once); video entries move by the preceding parts' counts.

The checks come first and refuse clearly: the parts must share format, kind and classes
(field packs also their schema and COCO category map), their conversion options must agree apart from the shard index, every part must record the
same listing of the whole input (``conversion.inputs.listing``: a tree or list that changed
between the parts' runs moved the split points), and shard indices must be
``0..N-1``, each exactly once (``any_parts=True`` merges any compatible outputs in the given
order instead). The combining itself is the format's ``Writer.merge_parts`` hook: by default
a re-pack through the format's writer (any format), overridable with a fast path.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from packer.claim import Claim, check_part, claim_output
from packer.conversion.runner import check_output_arg
from packer.errors import CorruptData, OutputClaimed, UsageError
from packer import formats
from packer.formats import Reader
from packer.remote import open_reader
from packer.formats.writer import Writer
from packer.formats.sidecars import partial_path
from packer.manifest import created_by
from packer.remote.url import is_url, redact

__all__ = ["MergeReport", "combined_videos", "merge_parts", "open_parts", "part_of", "part_paths", "read_failures", "remove_partial",
           "run_options", "writer_of"]

log = logging.getLogger(__name__)

# created_by options that name the part, not what was converted
# (listing: compared by _check_listing; append_to, a split append's base: by _check_append_to)
_PART_OPTIONS = ("num_shards", "shard_index", "listing", "append_to")


@dataclass
class MergeReport:
    """The outcome of a merge."""
    # Shaped like diskspace.Estimate (counts + a one-line summary); nothing in common beyond that.

    out: str
    parts: int
    count: int
    failures: int
    videos: int
    elapsed: float
    version: int | None = None  # an ``append``: the version of ``out`` it published (or found published)
    added: int = 0  # an ``append``: the samples it added
    note: str = ""

    def summary(self) -> str:
        """One line for the terminal."""
        videos = f", {self.videos} videos" if self.videos else ""
        if self.version is not None:
            note = f"; {self.note}" if self.note else ""
            return (f"{self.out}: version {self.version}: {self.added} samples added from {self.parts} parts "
                    f"({self.count} in all), {self.failures} failures recorded, in {self.elapsed:.1f}s{note}")
        return (f"{self.out}: merged {self.parts} parts, {self.count} samples{videos}, "
                f"{self.failures} failures recorded, in {self.elapsed:.1f}s")


def part_of(reader: Reader) -> tuple[int, int] | None:
    """``(shard_index, num_shards)`` from a packed output's ``created_by``, or None if unrecorded."""
    options = reader.manifest.created_by.get("options") or {}
    try:
        index, total = int(options["shard_index"]), int(options["num_shards"])
    except (KeyError, TypeError, ValueError):
        return None
    return (index, total) if 0 <= index < total else None


def writer_of(reader: Reader) -> type[Writer]:
    """The Writer class of a packed output's format (from the registry, video-only formats too)."""
    name = reader.manifest.format
    for table in (formats.FORMATS, formats.VIDEO_FORMATS, formats.VIDEO_FILE_FORMATS):
        if name in table:
            return table[name][0]
    raise UsageError(f"{reader.path}: no writer for format {name!r}")


def read_failures(reader: Reader) -> list[dict[str, Any]]:
    """The failure records of a packed output (its ``failures.jsonl``), in order."""
    path = writer_of(reader).failures_path(reader.path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise CorruptData(str(path), "missing (every packed output has a failures file)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CorruptData(str(path), f"cannot read ({e})") from e
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            raise CorruptData(str(path), "not a JSON object", position=f"line {lineno}")
        records.append(record)
    return records


def _open_part(path: Path | str, remote: Any = None) -> Reader:
    if is_url(path):  # a remote part: read through the node cache
        return open_reader(path, remote=remote)
    if path.name.endswith(".lock") and not path.is_dir():
        base = path.with_name(path.name[:-len(".lock")])
        check_part(base)  # names the holder
        raise UsageError(f"{path}: is the claim file of {base.name}, not a part")
    check_part(path)
    if path.name.endswith(".partial"):
        raise UsageError(f"{path}: is an unfinished part; rerun its command with --resume, then merge "
                         f"{path.name[:-len('.partial')]}")
    if not path.exists():
        if partial_path(path).exists():
            raise UsageError(f"{path}: that part did not finish ({partial_path(path).name} is there); "
                             "rerun its command with --resume, then merge")
        raise UsageError(f"{path}: part does not exist")
    return open_reader(path)


def _check_compatible(readers: Sequence[Reader]) -> None:
    """Same format, kind and classes across every part."""
    first = readers[0]
    for r in readers[1:]:
        for what, a, b in (("format", first.manifest.format, r.manifest.format),
                           ("kind", first.manifest.kind, r.manifest.kind)):
            if a != b:
                raise UsageError(f"{r.path}: {what} {b!r} differs from {first.path}'s {a!r}; "
                                 "parts of one dataset share it")
        _check_same_fields(first, r)  # (before the classes: a COCO pack's are its category names)
        if r.classes != first.classes:
            raise UsageError(f"{r.path}: classes differ from {first.path}'s "
                             f"({len(r.classes)} vs {len(first.classes)} classes); parts of one "
                             "dataset share the class list")


def _fields_text(reader: Reader) -> str:
    schema = reader.schema
    return "no fields (an image pack)" if schema is None else ", ".join(map(repr, schema.fields))


def _check_same_fields(first: Reader, r: Reader) -> None:
    """Field packs merge only with the same schema, and COCO packs with the same category map
    (label -> category id and name): the labels of one would mean other classes in the other."""
    if (r.manifest.schema or None) != (first.manifest.schema or None):
        raise UsageError(f"{r.path}: its fields ({_fields_text(r)}) differ from {first.path}'s "
                         f"({_fields_text(first)}); only field packs of one schema merge")
    a, b = first.manifest.extra.get("coco"), r.manifest.extra.get("coco")
    if a == b:
        return
    if not isinstance(a, dict) or not isinstance(b, dict) or a.get("kind") != b.get("kind"):
        raise UsageError(f"{r.path}: its COCO annotations ({_coco_text(b)}) differ from {first.path}'s "
                         f"({_coco_text(a)}); only packs of one kind of COCO file merge")
    cats_a, cats_b = a.get("categories") or [], b.get("categories") or []
    diff = next((i for i in range(max(len(cats_a), len(cats_b)))
                 if i >= len(cats_a) or i >= len(cats_b) or cats_a[i] != cats_b[i]), None)
    shown = "" if diff is None else (f" (label {diff}: {_category(cats_b, diff)} here, "
                                     f"{_category(cats_a, diff)} there)")
    raise UsageError(f"{r.path}: its COCO category map differs from {first.path}'s{shown}; parts of one "
                     "dataset map categories to labels alike (pack them from one annotation file's categories)")


def _coco_text(coco: Any) -> str:
    return f"a COCO {coco.get('kind')} file" if isinstance(coco, dict) else "no COCO file"


def _category(cats: list, i: int) -> str:
    if i >= len(cats):
        return "none"
    c = cats[i]
    return f"id {c.get('id')} {c.get('name')!r}" if isinstance(c, dict) else repr(c)


def _check_disjoint(readers: Sequence[Reader]) -> None:
    """No sample key in two parts."""
    seen: dict[str, Path] = {}
    for r in readers:
        for key in r.keys:
            if key in seen:
                raise UsageError(f"{r.path}: key {key!r} is also in {seen[key]}; parts may not overlap")
            seen[key] = r.path


def _shard_order(readers: Sequence[Reader]) -> list[Reader]:
    """The parts sorted by shard index, refusing unless they are parts 0..N-1 of one run."""
    parts = []
    for r in readers:
        p = part_of(r)
        if p is None:
            raise UsageError(f"{r.path}: its manifest does not say which part it is (no num_shards/"
                             "shard_index in created_by); use --any-parts to merge in the given order")
        parts.append((p, r))
    total = parts[0][0][1]
    for (index, n), r in parts:
        if n != total:
            raise UsageError(f"{r.path}: is part {index} of {n}, but {parts[0][1].path} is part "
                             f"{parts[0][0][0]} of {total}")
    by_index: dict[int, Reader] = {}
    for (index, _), r in parts:
        if index in by_index:
            raise UsageError(f"{r.path} and {by_index[index].path} are both part {index} of {total}")
        by_index[index] = r
    missing = [i for i in range(total) if i not in by_index]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        what = f"part {shown} of {total} is" if len(missing) == 1 else f"parts {shown} of {total} are"
        raise UsageError(f"{what} missing (got {len(by_index)} of {total}); merge needs every part")
    _check_listing([by_index[i] for i in range(total)])
    options = run_options(by_index[0])
    for i in range(1, total):
        other = run_options(by_index[i])
        if other != options:
            diff = sorted(k for k in set(options) | set(other) if options.get(k) != other.get(k))
            raise UsageError(f"{by_index[i].path}: converted with other options than {by_index[0].path} "
                             f"({', '.join(diff)} differ); use --any-parts to merge anyway")
    versions = {r.manifest.created_by.get("packer") for r in readers}
    if len(versions) > 1:
        log.warning("parts were written by different packer versions: %s", sorted(map(str, versions)))
    return [by_index[i] for i in range(total)]


def _listing_of(reader: Reader) -> Any:
    return (reader.manifest.created_by.get("options") or {}).get("listing")


def _show_listing(listing: Any) -> str:
    if not isinstance(listing, dict):
        return "no listing recorded (an older packer)"
    files = ", ".join(f"{name[:-len('_file_sha256')]} file sha256 {str(digest)[:12]}"
                      for name, digest in sorted(listing.items()) if name.endswith("_file_sha256"))
    return (f"{listing.get('listed_inputs')} inputs (sha256 {str(listing.get('listed_inputs_sha256'))[:12]}), "
            f"{listing.get('unusable_inputs')} unusable lines or entries" + (f", {files}" if files else ""))


def _check_listing(parts: Sequence[Reader]) -> None:
    """Every part of one split run was cut from the same listing of the inputs (its manifest's
    ``listing``, see ``conversion.inputs.listing``); refuse naming which parts differ and how.
    Parts that all record none (an older packer) are not compared."""
    listings = [_listing_of(r) for r in parts]
    if all(x is None for x in listings):
        return
    groups: dict[str, list[int]] = {}
    for i, x in enumerate(listings):
        groups.setdefault(json.dumps(x, sort_keys=True), []).append(i)
    if len(groups) == 1:
        return
    lines = []
    for key, indices in groups.items():
        names = ", ".join(f"{i} ({parts[i].path})" for i in indices[:5]) + (" ..." if len(indices) > 5 else "")
        lines.append(f"part{'s' if len(indices) > 1 else ''} {names}: {_show_listing(json.loads(key))}")
    raise UsageError("the parts were cut from different listings of the inputs (the tree or list changed "
                     "between their runs, so the split points moved: inputs would be lost or doubled):\n  "
                     + "\n  ".join(lines) + "\nrerun every part over the inputs as they are now")


def run_options(reader: Reader) -> dict[str, Any]:
    options = dict(reader.manifest.created_by.get("options") or {})
    for k in _PART_OPTIONS:
        options.pop(k, None)
    # Commit sizes decide how a run was cut into durable steps (what --resume keeps), not what
    # a part holds; parts made with different ones merge.
    options.pop("commit_every", None)
    if isinstance(options.get("writer"), dict):
        options["writer"] = {k: v for k, v in options["writer"].items() if k not in ("commit_every", "commit_bytes")}
    return options


def combined_videos(readers: Sequence[Reader]) -> list[dict[str, Any]]:
    """The parts' ``videos`` entries in order, each ``start`` counted from the first part's first
    sample (and no ``index``: the merged samples are numbered by their entries' positions)."""
    videos, before = [], 0
    for r in readers:
        for v in r.manifest.videos:
            videos.append({**{k: x for k, x in v.items() if k != "index"}, "start": int(v["start"]) + before})
        before += len(r)
    return videos


def merge_parts(parts: Sequence[str | os.PathLike], out: str | os.PathLike, *, overwrite: bool = False,
                any_parts: bool = False, remote: Any = None, break_lock: bool = False,
                claim: Claim | None = None) -> MergeReport:
    """Merge the parts of a sharded conversion into ``out`` (built at ``{out}.partial``, then renamed).

    Args:
        parts: the part outputs (any order: they are sorted by shard index).
        out: the merged output; it must not exist unless ``overwrite``.
        overwrite: replace an existing packer output at ``out``.
        any_parts: merge any outputs of one format, kind and class list in the order given,
            not only the parts ``0..N-1`` of one ``--num-shards`` run.
        remote: ``packer.remote.RemoteOptions`` for parts or ``out`` given as URLs (parts are read
            through the node cache; a URL ``out`` is built in a staging folder, then uploaded).
        break_lock: take the claim on a URL ``out``'s staging folder even from a run that may be alive.
        claim: the run's claim on a local ``out`` (``packer.api.merge`` takes it), which guards
            the publish; None: unclaimed (a library call of this function alone).
    Returns:
        a MergeReport.
    Raises:
        OutputClaimed: ``out`` is claimed by another run, or a part is claimed or half rewritten.
    """
    if not parts:
        raise UsageError("merge needs at least one part")
    if is_url(out):
        return _merge_to_url(parts, str(out), overwrite=overwrite, any_parts=any_parts, remote=remote,
                             break_lock=break_lock)
    return _merge_parts(parts, out, overwrite=overwrite, any_parts=any_parts, remote=remote, claim=claim)


def _merge_parts(parts: Sequence[str | os.PathLike], out: str | os.PathLike, *, overwrite: bool,
                 any_parts: bool, remote: Any, claim: Claim | None) -> MergeReport:
    start = time.monotonic()
    out = Path(out)
    paths = part_paths(parts, out)
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise UsageError(f"{out}: already exists (use --overwrite to replace it)")
    check_output_arg(out, resume=False, overwrite=overwrite)  # never deletes a foreign folder
    readers = open_parts(paths, any_parts=any_parts, remote=remote)
    planned = next((r for r in readers if (r.manifest.created_by.get("options") or {}).get("append_to")), None)
    if planned is not None:
        base = planned.manifest.created_by["options"]["append_to"]
        raise UsageError(f"{planned.path}: is a part of a split append to {base.get('path')} (its version "
                         f"{base.get('version')}); add the parts to it with merge --append")
    failures = [f for r in readers for f in read_failures(r)]
    videos = combined_videos(readers)
    options = run_options(readers[0]) if not any_parts else {}
    made_by = created_by(options)
    made_by["merged_from"] = [str(r.path) for r in readers]
    writer_cls = writer_of(readers[0])
    total = sum(len(r) for r in readers)
    log.info("merging %d parts (%d samples) into %s", len(readers), total, out)
    try:
        with tqdm(total=total, unit="sample", desc="merge", dynamic_ncols=True, disable=None) as bar:
            manifest = writer_cls.merge_parts(readers, out, created_by=made_by, failures=failures,
                                              videos=videos, overwrite=overwrite, progress=bar.update,
                                              guard=None if claim is None else
                                              (lambda w: claim.partial(w.workdir, w.journal_dir)))
    except OutputClaimed:
        raise  # the partial is not (or no longer) this run's to remove
    except BaseException:
        remove_partial(writer_cls, out)
        raise
    finally:
        for r in readers:
            r.close()
    return MergeReport(str(out), parts=len(readers), count=manifest.count, failures=manifest.failures,
                       videos=len(manifest.videos), elapsed=time.monotonic() - start)


def part_paths(parts: Sequence[str | os.PathLike], out: Path) -> list[Any]:
    """The parts as paths (URLs kept), refusing one given twice or ``out`` among them."""
    paths = [p if is_url(p) else Path(p) for p in parts]
    seen: dict[str, Path] = {}
    for p in paths:
        real = str(p) if is_url(p) else os.path.realpath(p)
        if real in seen:
            raise UsageError(f"{p}: given twice (as {seen[real]} too)")
        seen[real] = p
    if os.path.realpath(out) in seen:
        raise UsageError(f"{out}: is one of the parts; merge into a new path")
    return paths


def open_parts(paths: Sequence[Any], *, any_parts: bool, remote: Any = None) -> list[Reader]:
    """The parts open, checked to belong together (format, kind, classes; unless ``any_parts``
    parts ``0..N-1`` of one run with the same options and listing, in shard order; no key twice)."""
    readers = [_open_part(p, remote) for p in paths]
    _check_compatible(readers)
    if not any_parts:
        readers = _shard_order(readers)
    _check_disjoint(readers)
    return readers


def _merge_to_url(parts: Sequence[str | os.PathLike], url: str, *, overwrite: bool, any_parts: bool,
                  remote: Any, break_lock: bool) -> MergeReport:
    """Merge into a local staging folder, then upload (a merge is not resumable: stale staging goes)."""
    from packer.remote.upload import staged_output

    if any(str(p).rstrip("/") == url.rstrip("/") for p in parts):
        raise UsageError(f"{redact(url)}: is one of the parts; merge into a new path")
    storage = getattr(remote, "storage_options", None)
    staged = staged_output(url, overwrite=overwrite, storage_options=storage, fresh=True)
    # A merge rebuilds from the parts: a claim left by a dead merge is taken over.
    with claim_output(staged.local, takeover=True, break_lock=break_lock) as claim:  # through the upload
        report = merge_parts(parts, staged.local, overwrite=True, any_parts=any_parts, remote=remote, claim=claim)
        staged.upload()
    report.out = redact(url)
    return report


def remove_partial(writer_cls: type, out: Path) -> None:
    """A merge is not resumable: drop what a failed one left (it is rebuilt from the parts)."""
    work = partial_path(out)
    leftovers = [work, work.with_name(work.name + ".journal")]
    if writer_cls.single_file:
        leftovers.append(writer_cls.failures_path(work))
    for p in leftovers:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink()
