"""The resume fingerprint: everything that decides an output's bytes, so ``--resume`` never mixes
two datasets.

It is one mechanism, not a hand list per command:

* **options**: the command's ``created_by`` options (the manifest's record of how the output was
  made). Every command records each option that changes what is stored there (resize, quality,
  check mode, extensions, frame selection, backend, shard sizes, template, start index, writer
  options...), so a new option is covered by recording it, which the manifest needs anyway.
  Only the options in :data:`NEUTRAL` (where the input lives, not what it holds) are left out.
* **format**: the format name and ``FORMAT_VERSION``; the class names.
* **inputs**: the keys and labels in order (digested), and per input the source file's size
  and mtime (ns) (digested apart). A resume refuses any change of keys, labels or order; a
  changed size or mtime only for an input already stored in the kept prefix (an input that
  failed, or is not reached yet, may be fixed between the runs: it is retried or packed anew).

A partial output keeps the per-input table (``.inputs.json`` beside the resume checkpoint) so a
refusal can name what changed (``3 inputs changed since the first run, e.g. a/x.jpg``); a finished
output keeps the fingerprint (with the input digest) in its manifest, so ``--resume`` on it can
say whether it was made from this input with these options.
"""
from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import struct
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from packer.formats.sidecars import fsync_append
from packer.manifest import FORMAT_VERSION, atomic_write_bytes

if TYPE_CHECKING:
    import numpy as np

__all__ = ["NEUTRAL", "Fingerprint", "input_rows", "input_stats", "file_stat", "file_stats", "differences", "save_inputs",
           "load_inputs", "append_input_stats", "item_stat", "INPUT_STATS_NAME", "option_differences", "COMMIT_OPTIONS",
           "writer_settings"]

# created_by options that say where the input lives, not what the output holds: moving the
# source folder between an interrupted run and its resume is fine (each file's size and mtime
# still have to match).
# ``label_map`` names where the class numbering came from (a built-in map, a --class-index
# path): the class names and every label are in the fingerprint themselves.
NEUTRAL = frozenset({"src", "list", "csv", "root", "class_index", "label_map"})
# Commit sizes say where a run may stop, not what it stores (the resume keeps whole commits and
# the result equals an uninterrupted run) -- except in records, where a commit is a shard.
COMMIT_OPTIONS = frozenset({"commit_every", "commit_bytes"})
LAYOUT_BY_COMMIT = frozenset({"records"})

INPUTS_NAME = ".inputs.json"
# (size, mtime_ns) of each input as the run read it, appended at each durable point of a fresh
# run: the table's keys and labels are known at the start, each file's size and mtime when it
# is packed (from the read's own fstat: no separate pass over millions of files first).
INPUT_STATS_NAME = ".inputs.stat"
_STAT = struct.Struct("<qq")
_PATH = attrgetter("path")


def writer_settings(writer: Any, given: dict[str, Any]) -> dict[str, Any]:
    """Every keyword option of ``writer``'s class as the writer holds it (the value it normalised,
    e.g. ``"256MB"`` -> 256000000, else what was ``given``, else the default), JSON-ready: what a
    command records in ``created_by``, so a library call that leaves an option at its default and
    a CLI run that spells the default out record the same thing."""
    settings: dict[str, Any] = {}
    for klass in reversed(type(writer).__mro__):
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind is p.KEYWORD_ONLY and p.default is not p.empty and p.name not in ("kind", "created_by"):
                settings[p.name] = p.default
    settings.update(given)
    for name in settings:
        held = getattr(writer, name, settings[name])
        if held is None or isinstance(held, (bool, int, float, str, list, tuple)):
            settings[name] = held
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.items()}


def input_rows(items: Sequence[Any]) -> list[list[Any]]:
    """``[key, label]`` per item (the label is the list of labels of a multi-label item)."""
    return [[it.key, list(it.labels) if getattr(it, "labels", ()) else it.label] for it in items]


def file_stat(path: str) -> tuple[int, int]:
    """``(size, mtime_ns)`` of ``path``, ``(-1, -1)`` when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return -1, -1
    return st.st_size, st.st_mtime_ns


def file_stats(paths: Iterable[str]) -> "np.ndarray":
    """``file_stat`` of each path as an ``(n, 2)`` int64 array (size, mtime_ns): one ``stat``
    each and no Python object per path kept (what ``--append`` compares millions of inputs by)."""
    import numpy as np

    flat: list[int] = []
    add, stat = flat.extend, os.stat
    for path in paths:
        try:
            st = stat(path)
        except OSError:
            add((-1, -1))
            continue
        add((st.st_size, st.st_mtime_ns))
    return np.array(flat, dtype=np.int64).reshape(-1, 2)


def item_stat(item: Any) -> tuple[int, int]:
    """What the resume compares of an item's input: its ``identity()`` where it has one (a
    sample inside a container: ``packer.conversion.inputs.SourceItem``), else its file's
    ``file_stat``."""
    identity = getattr(item, "identity", None)
    return identity() if identity is not None else file_stat(item.path)


def item_stats(items: Sequence[Any]) -> "np.ndarray":
    """``item_stat`` of each item as an ``(n, 2)`` int64 array: ``file_stats`` of their paths
    when none has an ``identity()`` of its own (the usual files), else item by item."""
    import numpy as np

    # (an item's identity() is its class's method: asked of each class once, not of each item)
    if not any(getattr(kind, "identity", None) is not None for kind in set(map(type, items))):
        return file_stats(list(map(_PATH, items)))
    return np.array([item_stat(it) for it in items], dtype=np.int64).reshape(-1, 2)


def input_stats(items: Sequence[Any]) -> list[list[Any]]:
    """``[key, label, size, mtime_ns]`` per item (size and mtime -1 when the source is missing;
    the label is the list of labels of a multi-label item)."""
    return [row + list(item_stat(it)) for row, it in zip(input_rows(items), items)]


def _flatten(options: dict[str, Any], neutral: frozenset, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in options.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, neutral, f"{name}."))
        elif (not prefix and k in NEUTRAL) or k in neutral:
            continue
        else:
            flat[name] = v
    return flat


def _digests(stats: Sequence[list[Any]]) -> tuple[str, str | None]:
    """sha256 over ``json.dumps(row[:2], ensure_ascii=False)`` lines (key and label) and over
    ``json.dumps(row, ensure_ascii=False)`` lines (with size and mtime), in one pass; the second
    is None when the rows hold no size and mtime yet (``[key, label]`` rows)."""
    full = bool(stats) and len(stats[0]) > 2
    short, files = hashlib.sha256(), hashlib.sha256() if full or not stats else None
    for start in range(0, len(stats), 10_000):
        pairs = [_row_json(row) for row in stats[start:start + 10_000]]
        short.update(("\n".join(p for p, _ in pairs) + "\n").encode("utf-8", "surrogateescape"))
        if files is not None:
            files.update(("\n".join(f for _, f in pairs) + "\n").encode("utf-8", "surrogateescape"))
    return short.hexdigest(), None if files is None else files.hexdigest()


_encode_str = json.encoder.encode_basestring  # json.dumps(str, ensure_ascii=False), in C


def _row_json(row: list[Any]) -> tuple[str, str]:
    """``json.dumps`` (``ensure_ascii=False``) of ``row[:2]`` and of ``row``, ten times faster for
    the usual ``[key, label, size, mtime]`` row (a str and ints); anything else goes to json."""
    if type(row[0]) is str and type(row[1]) is int:
        head = f"[{_encode_str(row[0])}, {row[1]}"
        if len(row) == 4 and type(row[2]) is int and type(row[3]) is int:
            return head + "]", f"{head}, {row[2]}, {row[3]}]"
        if len(row) == 2:
            return head + "]", head + "]"
    return json.dumps(row[:2], ensure_ascii=False), json.dumps(row, ensure_ascii=False)


def _file_line(row: list[Any]) -> str:
    """``_row_json(row)[1]`` alone (``with_files``: the keys' half is not needed again)."""
    if len(row) == 4 and type(row[0]) is str and type(row[1]) is int and type(row[2]) is int and type(row[3]) is int:
        return f"[{_encode_str(row[0])}, {row[1]}, {row[2]}, {row[3]}]"
    return _row_json(row)[1]


class Fingerprint:
    """What decides an output's bytes (see the module docstring).

    Args:
        format: the output's format name.
        classes: class names, index = label.
        options: the command's ``created_by`` options (nested dicts are flattened).
        stats: :func:`input_stats` of the inputs in packed order, or :func:`input_rows` while
            the files' sizes and mtimes are not known yet (``files_sha256`` is then None: a
            resume compares the stored inputs through the per-input table).
    """

    def __init__(self, *, format: str, classes: Sequence[str], options: dict[str, Any],
                 stats: list[list[Any]]):
        self.format = format
        self.classes = list(classes)
        neutral = frozenset() if format in LAYOUT_BY_COMMIT else COMMIT_OPTIONS
        self.options = json.loads(json.dumps(_flatten(options, neutral), default=str))  # JSON-normalised
        self.stats = stats
        keys_sha, files_sha = _digests(stats)
        self.inputs = {"count": len(stats), "sha256": keys_sha, "files_sha256": files_sha}

    def with_files(self, stats: list[list[Any]]) -> "Fingerprint":
        """This fingerprint with ``stats`` (the full rows of the same inputs, in the same order)
        and their ``files_sha256``; the keys digest is kept, not hashed again."""
        if len(stats) != self.inputs["count"]:
            raise ValueError(f"{len(stats)} rows for a fingerprint of {self.inputs['count']} inputs")
        done = copy.copy(self)
        done.stats = stats
        files = hashlib.sha256()
        for start in range(0, len(stats), 10_000):
            lines = [_file_line(row) for row in stats[start:start + 10_000]]
            files.update(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
        done.inputs = {**self.inputs, "files_sha256": files.hexdigest()}
        return done

    def to_dict(self) -> dict[str, Any]:
        """The JSON form kept in the resume checkpoint and the finished manifest."""
        return {"format": self.format, "format_version": FORMAT_VERSION, "classes": self.classes,
                "options": self.options, "inputs": self.inputs}


def _show(v: Any) -> str:
    return "(unset)" if v is None else json.dumps(v, ensure_ascii=False) if not isinstance(v, (int, float)) else str(v)


def _option_name(name: str) -> str:
    return "--" + name.rsplit(".", 1)[-1].replace("_", "-")


def differences(old: Any, new: Fingerprint, old_stats: list[list[Any]] | None = None,
                stored: set[str] | None = None) -> list[str]:
    """One line per difference between a recorded fingerprint ``old`` and ``new``: an option
    (``--short-side: 64 -> 128``), the format, the classes, the inputs (named through
    ``old_stats`` when the per-input table was kept). ``stored``: the keys already stored in a
    partial output (only their files must be unchanged); None: every input's (a finished
    output). Empty when they match."""
    if not isinstance(old, dict) or "options" not in old:
        return ["the output was started by an older packer that recorded no full fingerprint"]
    now = new.to_dict()
    lines = []
    if old.get("format") != now["format"] or old.get("format_version") != now["format_version"]:
        lines.append(f"format: {old.get('format')} v{old.get('format_version')} -> "
                     f"{now['format']} v{now['format_version']}")
    lines.extend(option_differences(old.get("options") or {}, now["options"]))
    if old.get("classes") != now["classes"]:
        lines.append(f"classes: {len(old.get('classes') or [])} before ({_preview(old.get('classes'))}), "
                     f"{len(now['classes'])} now ({_preview(now['classes'])})")
    then = old.get("inputs") or {}
    if then.get("count") != now["inputs"]["count"] or then.get("sha256") != now["inputs"]["sha256"]:
        lines.append(_inputs_line(then, new, old_stats))
    elif then.get("files_sha256") != now["inputs"]["files_sha256"]:
        if stored is None:  # a finished output: every input's file counts
            lines.append(_inputs_line(then, new, old_stats))
        elif old_stats is None:  # no per-input table to tell which: only a start is safe
            if stored:
                lines.append(_inputs_line(then, new, None))
        else:
            unknown = [a[0] for a in old_stats if len(a) < 4 and a[0] in stored]
            if unknown:  # the stat journal lost rows it had fsync'ed before the checkpoint
                lines.append(f"the interrupted run's input table has no size and mtime for {len(unknown)} "
                             f"stored inputs (e.g. {unknown[0]}): its {INPUT_STATS_NAME} is damaged; "
                             "use --overwrite")
                return lines
            changed = [a[0] for a, b in zip(old_stats, new.stats) if a != b and a[0] in stored]
            if changed:
                lines.append(f"{len(changed)} inputs changed since the first run (size or mtime), "
                             f"e.g. {changed[0]}")
    return lines


def option_differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per option that differs between two fingerprints' (flattened) ``options``:
    ``--short-side: 64 -> 128``."""
    return [f"{_option_name(name)}: {_show(before.get(name))} -> {_show(after.get(name))}"
            for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]


def _preview(names: Any) -> str:
    names = list(names or [])
    return ", ".join(map(str, names[:3])) + (", ..." if len(names) > 3 else "")


def _inputs_line(old: dict[str, Any], new: Fingerprint, old_stats: list[list[Any]] | None) -> str:
    if old_stats is None:
        return (f"the inputs changed since the first run ({old.get('count', '?')} inputs then, "
                f"{new.inputs['count']} now, or a file's size, mtime or label differs)")
    then = {row[0]: row for row in old_stats}
    now = {row[0]: row for row in new.stats}
    # (a row of the first run without size and mtime, an input it had not read, compares its key
    # and label only)
    changed = sorted(k for k in then.keys() & now.keys() if then[k] != now[k][:len(then[k])])
    gone, added = sorted(then.keys() - now.keys()), sorted(now.keys() - then.keys())
    order = not changed and not gone and not added  # the same inputs in another order
    parts = []
    if changed:
        parts.append(f"{len(changed)} inputs changed since the first run (size, mtime or label), e.g. {changed[0]}")

    if gone:
        parts.append(f"{len(gone)} inputs gone, e.g. {gone[0]}")
    if added:
        parts.append(f"{len(added)} inputs new, e.g. {added[0]}")
    if order:
        parts.append("the inputs are in another order than in the first run")
    return "; ".join(parts)


def save_inputs(directory: Path, stats: list[list[Any]]) -> None:
    """Keep the per-input table beside the resume checkpoint (written once, at the start): full
    rows, or ``[key, label]`` rows whose sizes and mtimes ``append_input_stats`` adds as the
    run goes (any older stat journal is dropped). In the order a kill between the two steps
    leaves resumable: full rows replace the table before the old journal goes (which adds
    nothing to a full row); short rows, after it (it would add its stats to them)."""
    journal = Path(directory) / INPUT_STATS_NAME
    full = bool(stats) and len(stats[0]) > 2
    if not full:
        journal.unlink(missing_ok=True)
    atomic_write_bytes(Path(directory) / INPUTS_NAME, json.dumps(stats, ensure_ascii=False).encode("utf-8"))
    if full:
        journal.unlink(missing_ok=True)


def append_input_stats(directory: Path, stats: Sequence[int]) -> None:
    """Append the size and mtime_ns of the next inputs of the table (in order; ``stats`` flat:
    size, mtime, size, mtime, ...) and fsync."""
    if len(stats) % 2:
        raise ValueError("append_input_stats takes a size and an mtime per input")
    fsync_append(Path(directory) / INPUT_STATS_NAME, struct.pack(f"<{len(stats)}q", *stats))


def load_inputs(directory: Path) -> list[list[Any]] | None:
    """The per-input table of the first run, or None when missing or unreadable; ``[key,
    label]`` rows get the size and mtime the stat journal holds for them (a torn last entry of
    a run cut short is ignored), the others stay as they are."""
    try:
        stats = json.loads((Path(directory) / INPUTS_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stats, list):
        return None
    try:
        raw = (Path(directory) / INPUT_STATS_NAME).read_bytes()
    except OSError:
        raw = b""
    for i, (size, mtime) in enumerate(_STAT.iter_unpack(raw[:len(raw) - len(raw) % _STAT.size])):
        if i >= len(stats):
            break
        if isinstance(stats[i], list) and len(stats[i]) == 2:
            stats[i] = stats[i] + [size, mtime]
    return stats
