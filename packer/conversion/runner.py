"""``run(items, work_fn, writer, executor)``: the one conversion loop behind every command.

It owns parallelism (through an executor), ordered writing, the failure report, the
progress bar and ``--resume``. Formats never see processes; work functions never see
formats. Resume is exact: after each durable commit of the writer a checkpoint records
how many input items are fully stored; a rerun keeps that prefix (truncating anything the
writer stored past it), retries the prefix's failed items (if one now succeeds, the output
is cut back to its position so the result still equals an uninterrupted run) and goes on.
"""
from __future__ import annotations

import collections
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm import tqdm

from packer.errors import CorruptData, ResumeRefused, UsageError, WriteError
from packer.claim import Claim
from packer.conversion.executors import Executor, InlineExecutor, Outcome
from packer.conversion.placement import is_packer_output
from packer.conversion.fingerprint import (INPUT_STATS_NAME, INPUTS_NAME, Fingerprint, append_input_stats,
                                           differences, input_rows, input_stats, item_stat, load_inputs,
                                           option_differences, save_inputs)
from packer.conversion.executors.base import WorkResult, as_result
from packer.conversion.options import RunOptions
from packer.formats import Writer, open_reader
from packer.formats.sample import Sample
from packer.formats.segments import StoredSamples
from packer.formats.sidecars import partial_path
from packer.formats.versions import next_video_index
from packer.heap import tune_heap
from packer.manifest import atomic_write_bytes
from packer.conversion.inputs import InputFailure, Item
from packer.conversion.append import AppendPlan

__all__ = ["WorkResult", "Report", "run", "check_output_arg", "counted_failures", "as_result"]

log = logging.getLogger(__name__)


@dataclass
class Report:
    """The outcome of a conversion."""

    out: str
    count: int = 0
    items: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0
    bytes: int = 0
    status: str = "done"  # done | resumed | complete | uploaded (a URL OUT done earlier) | appended
    strict: bool = False  # partial decodes count as failures
    note: str = ""  # what a finished-output --resume checked
    upload: Any = None  # a URL OUT: the UploadReport of its upload (packer.remote.upload)
    labels: str = ""  # where the labels came from (a class-folder tree's label map or order)
    version: int = 1  # the version of the output published (an --append publishes the next one)
    added: int = 0  # an --append: the samples it added

    @property
    def failed(self) -> int:
        """Failures that count toward --max-failures (partial decodes only with ``strict``)."""
        return counted_failures(self.failures, strict=self.strict)

    def summary(self) -> str:
        """One line for the terminal."""
        rate = self.count / self.elapsed if self.elapsed > 0 else 0.0
        if self.status == "complete":
            return f"{self.out}: complete and verified ({self.count} samples, {self.note}); nothing to do"
        if self.status == "uploaded":
            return f"{self.out}: already complete and uploaded; nothing to do"
        unusable = sum(1 for f in self.failures if f.get("stage") == "input")
        lines = f" ({unusable} input lines or entries unusable)" if unusable else ""
        if self.status == "current":
            note = f"; {self.note}" if self.note else ""
            return f"{self.out}: version {self.version} holds every input ({self.count} samples); nothing to append{note}"
        if self.status == "appended":
            note = f"; {self.note}" if self.note else ""
            return (f"{self.out}: version {self.version}: {self.added} samples added from {self.items} new inputs"
                    f"{lines} ({self.count} in all), {self.failed} failed, {self.bytes / 1e6:.1f} MB in "
                    f"{self.elapsed:.1f}s{note}")
        return (f"{self.out}: {self.count} samples from {self.items} inputs{lines}, {self.failed} failed, "
                f"{self.bytes / 1e6:.1f} MB in {self.elapsed:.1f}s ({rate:.0f} samples/s)")


def counted_failures(failures: Sequence[dict[str, Any]], *, strict: bool = False) -> int:
    """How many failure records count toward --max-failures: all but partial decodes,
    which count only under ``strict`` (they stay ``stage: "partial"`` either way)."""
    return sum(1 for f in failures if strict or f.get("stage") != "partial")


def check_output_arg(out: str | os.PathLike, *, resume: bool, overwrite: bool) -> None:
    """Refuse before any work: an existing output needs --resume or --overwrite, not both."""
    if resume and overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    out = Path(out)
    if (out.exists() or out.is_symlink()) and not (resume or overwrite):
        raise UsageError(f"{out}: already exists (use --overwrite to replace it or --resume to continue)")
    if overwrite and out.exists() and not out.is_symlink() and not is_packer_output(out):
        # --overwrite replaces a packer output (or an empty folder), never anything else
        if out.is_file() or any(out.iterdir()):
            raise UsageError(f"{out}: exists and is not a packer output; refusing to overwrite it "
                             "(remove it yourself if it is to go)")


class _Checkpointer:
    """Tracks which input items are fully durable and writes the resume checkpoint."""

    def __init__(self, path: Path, fp: dict[str, Any], items_done: int, samples: int,
                 failures: list[dict[str, Any]], entries: list[dict[str, Any]], overwrite: bool,
                 stats: list[int] | None = None, base: dict[str, Any] | None = None):
        self.path = path
        self.base = base  # an --append: the published version it continues
        # a fresh run's size and mtime_ns per item as it was read (two ints an item, flat: no
        # tuple per item for the garbage collector to walk), journaled up to each durable point
        self.stats = stats
        self.journaled = 0
        self.fp = fp
        self.overwrite = overwrite
        self.items_done = items_done
        self.samples = samples
        self.failures = failures  # each with internal "index" and "at"
        self.entries = entries  # each with internal "index"
        # item index, samples the writer holds after it (two ints an item, flat), appended by the
        # run loop per item
        self.pending: collections.deque = collections.deque()

    def durable(self, n: int) -> None:
        changed = False
        pending = self.pending
        while pending and pending[1] <= n:
            index, after = pending.popleft(), pending.popleft()
            self.items_done, self.samples = index + 1, after
            changed = True
        if changed:
            if self.stats is not None and self.items_done > self.journaled:
                try:
                    append_input_stats(self.path.parent, self.stats[2 * self.journaled:2 * self.items_done])
                except OSError as e:
                    raise WriteError(f"{self.path.parent}: cannot save the input table "
                                     f"({e.strerror or e})") from e
                self.journaled = self.items_done
            self.save()

    def save(self) -> None:
        state = {"fingerprint": self.fp, "overwrite": self.overwrite, "items_done": self.items_done, "samples": self.samples,
                 "failures": [f for f in self.failures if f["index"] < self.items_done],
                 "entries": [e for e in self.entries if e["index"] < self.items_done]}
        if self.base is not None:
            state["append_to"] = self.base
        try:
            atomic_write_bytes(self.path, json.dumps(state).encode())
        except OSError as e:
            raise WriteError(f"{self.path}: cannot save the resume checkpoint ({e.strerror or e})") from e


def _public(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("index", "at", "note")}


@dataclass
class _State:
    """Where a (possibly resumed) conversion stands: input items fully stored, samples they gave,
    the failure records and manifest entries so far (each with its internal item ``index``)."""

    items_done: int = 0
    samples: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    overwrite: bool = False
    resumed: bool = False
    videos_before: int = 0  # an --append: the videos of the version it continues (``video_index``)


def _check_finished(out: Path, fp: Fingerprint, items: int) -> Report:
    """``--resume`` of a finished output: verify every checksum and compare the fingerprint its
    manifest records with this run's; refuse (naming what is wrong) or report it verified."""
    reader = open_reader(out)
    problems = [str(p) for p in reader.verify()]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CorruptData(str(out), f"the finished output fails verification: {'; '.join(problems[:3])}{more}")
    recorded = reader.manifest.fingerprint
    note = "every checksum and the fingerprint checked"
    if not recorded:  # a merged output or one made before fingerprints: say what was not checked
        note = "every checksum checked; its manifest records no fingerprint, so options and inputs were not compared"
    else:
        diff = differences(recorded, fp)
        if reader.manifest.version > 1:  # an appended output: its inputs are another run's business
            now = fp.to_dict()
            diff = option_differences(recorded.get("options") or {}, now["options"])
            if recorded.get("format") != now["format"]:
                diff.insert(0, f"format: {recorded.get('format')} -> {now['format']}")
            note = (f"every checksum and the options checked; version {reader.manifest.version} of an appended "
                    "output: rerun --append to add what is new")
        if diff:
            raise ResumeRefused(f"{out}: is complete but was made differently from this run:\n  "
                                + "\n  ".join(diff) + "\n(use --overwrite to make it again)")
    log.info("%s is complete and verified", out)
    return Report(str(out), count=len(reader), items=items, status="complete", note=note)


def _resume_state(items: Sequence[Item], work_fn: Callable[[Item], Any], writer: Writer,
                  executor: Executor, fp: Fingerprint, input_failures: list[dict[str, Any]],
                  append: AppendPlan | None = None, refuse: bool = True) -> _State:
    """The state a ``--resume`` continues from: the checkpoint's prefix, cut back to the first
    earlier failure that now succeeds (so the result equals an uninterrupted run). A checkpoint
    whose fingerprint differs from this run's is refused before any work (ResumeRefused); an
    ``--append`` that is not told ``--resume`` (``refuse`` False) starts its work again instead
    (nothing of it was published)."""
    state_path = writer.resume_state_path()
    if not state_path.exists():
        return _State(failures=input_failures)
    try:
        ckpt = json.loads(state_path.read_text())
    except (OSError, ValueError) as e:
        if not refuse:
            return _State(failures=input_failures)
        raise CorruptData(str(state_path), f"unreadable resume checkpoint ({e}); use --overwrite") from e
    if append is not None and "append_to" not in ckpt:
        raise UsageError(f"{writer.out}: {state_path.parent.name} is an unfinished run that rewrites the output, "
                         "not an append; finish it with --resume (or remove it), then append")
    done = min(int(ckpt.get("items_done", 0)), len(items))
    failed = {f["key"] for f in ckpt.get("failures", []) if f.get("index", -1) >= 0 and not f.get("note")}
    stored = {it.key for it in items[:done]} - failed  # their files must not have changed
    diff = differences(ckpt.get("fingerprint"), fp, load_inputs(state_path.parent), stored)
    if append is not None and ckpt.get("append_to") != append.base_identity():
        then = ckpt.get("append_to") or {}
        diff.insert(0, f"the interrupted append continued version {then.get('version', '?')} "
                       f"(identity {then.get('identity', '?')}), this one version {append.base.manifest.version} "
                       f"(identity {append.base_identity()['identity']})")
    if diff and not refuse:
        log.info("%s: the interrupted append differs from this one; starting it again", writer.out)
        return _State(failures=input_failures)
    if diff:  # the partial output is left as it is
        raise ResumeRefused(f"{writer.out}: cannot resume, this run differs from the interrupted one:\n  "
                            + "\n  ".join(diff) + "\n(rerun with the first run's options, or use --overwrite)")
    st = _State(ckpt["items_done"], ckpt["samples"], ckpt["failures"], ckpt["entries"],
                bool(ckpt.get("overwrite")), resumed=True)
    # Retry the prefix's failures; the first that now succeeds cuts the output back to it.
    # Notes (partial decodes) were packed, so they are kept as they are.
    retry = [f for f in st.failures if not f.get("note") and f["index"] >= 0]  # not input lines
    for f, outcome in zip(retry, executor.map(work_fn, [items[f["index"]] for f in retry])):
        if outcome.ok:
            st.items_done, st.samples = f["index"], f["at"]
            st.failures = [g for g in st.failures if g["index"] < st.items_done]
            st.entries = [e for e in st.entries if e["index"] < st.items_done]
            break
    log.info("resuming %s at input %d of %d (%d samples kept)", writer.out, st.items_done, len(items),
             st.samples)
    return st


def _store(index: int, item: Item, outcome: Outcome, writer: Writer, st: _State) -> None:
    """Add one item's outcome to the output: its samples, manifest entry and failure records."""
    if outcome.ok:
        result = as_result(outcome.value)
        first = writer.count
        for sample in result.samples:
            if result.entry is not None:  # a video's frames: its position in the manifest's videos
                sample.extra["video_index"] = st.videos_before + len(st.entries)
            writer.add(sample)
        if result.entry is not None:
            st.entries.append({**result.entry, "start": first, "length": writer.count - first, "index": index})
        if result.note is not None:
            st.failures.append({"key": item.key, "source": item.path, "stage": "partial",
                                **result.note, "index": index, "at": first, "note": True})
    else:
        st.failures.append({"key": item.key, "source": item.path, "stage": outcome.stage,
                            "reason": outcome.reason, "index": index, "at": writer.count})
        log.warning("%s: %s", item.path, outcome.reason)


def _add_stored(index: int, samples: StoredSamples, items: Sequence[Item], writer: Writer,
                processed: Callable[[Any], None], record: Callable[[Any], None] | None) -> int:
    """Inputs ``index`` on, which gave one stored sample each (``samples``), added at once: their
    input rows and checkpoint rows first, then the samples (``Writer.add_stored``; a durable
    commit among them takes the rows up to it). Returns how many inputs."""
    n, count = len(samples), writer.count
    if record is not None:
        stats = samples.stats()
        if None in stats:  # a work that read no file: a stat then
            stats = [stat or item_stat(items[index + k]) for k, stat in enumerate(stats)]
        record(itertools.chain.from_iterable(stats))
    processed(itertools.chain.from_iterable(zip(range(index, index + n), range(count + 1, count + n + 1))))
    writer.add_stored(samples)
    return n


def run(items: Sequence[Item], work_fn: Callable[[Item], Any], writer: Writer, *,
        executor: Executor | None = None, options: RunOptions | None = None, desc: str = "packing",
        unit: str = "img", sample_unit: str | None = None, input_failures: Sequence[InputFailure] = (),
        all_in: Callable[[], None] | None = None, claim: Claim | None = None,
        append: AppendPlan | None = None) -> Report:
    """Run ``work_fn`` over ``items`` with ``executor`` and pack the results with ``writer``.

    Args:
        items: the inputs in packed order.
        work_fn: a picklable callable, item -> Sample | list[Sample] | WorkResult; raising
            ``CorruptSample`` (or anything) records a failure for that item.
        writer: an unopened Writer; ``run`` opens and closes it.
        executor: where work runs (inline when None).
        options: the run's ``RunOptions`` (default: the defaults): ``max_failures`` (the Report
            counts as failed past it; every good sample is packed either way), ``resume``
            (continue a partial output, or check a finished one and do nothing), ``overwrite``
            (replace an existing output when done), ``strict`` (partial decodes count as failures).
        desc, unit: the progress bar's label and item unit.
        sample_unit: when given, the progress bar also shows packed samples per second.
        input_failures: input lines or entries the parser could not turn into items (each
            recorded in ``failures.jsonl`` with stage ``input`` and counted like any failure).
        all_in: called once every item's outcome is in, before the final commit: the caller
            may start shutting ``executor`` down there (it is not used again).
        claim: the run's claim on ``writer.out`` (``packer.claim``, taken where the run
            started): handed to the writer as the guard of its partial output and checked at
            each durable commit. None: an unclaimed run (a Writer used directly).
        append: an ``--append`` (``packer.conversion.append``): ``items`` are the inputs it packs
            after the samples of the output's latest version, and ``writer`` publishes the next
            version. An interrupted append is continued (``options.resume``: only when it is the
            same append, else refused; without it, else started again).
    Returns:
        a Report.
    """
    opts = options if options is not None else RunOptions()
    tune_heap()  # freed buffers reused, not faulted in again per sample (packer.heap)
    if claim is not None:
        writer.guard = claim.partial(writer.workdir, writer.journal_dir)
    if append is not None:
        writer.append_to = append.base
    return _run(items, work_fn, writer, executor, opts, desc, unit, sample_unit, input_failures, all_in, claim,
                append)


def _run(items: Sequence[Item], work_fn: Callable[[Item], Any], writer: Writer, executor: Executor | None,
         opts: RunOptions, desc: str, unit: str, sample_unit: str | None,
         input_failures: Sequence[InputFailure] = (), all_in: Callable[[], None] | None = None,
         claim: Claim | None = None, append: AppendPlan | None = None) -> Report:
    """``run``'s work, under ``claim`` when there is one."""
    check_claim = claim.check if claim is not None else (lambda: None)
    executor = executor or InlineExecutor()
    out = writer.out
    start = time.monotonic()
    resuming = opts.resume or (append is not None and writer.resume_state_path().exists())
    # A resume compares every input's file with the first run's before any work: stat them all
    # now. A fresh run takes each file's size and mtime when it is packed (the work's own read,
    # ``Sample.source_stat``, else a stat then), so no pass over the inputs comes first.
    stats = input_stats(items) if resuming else input_rows(items)
    options = writer.created_by.get("options", {})
    fp = Fingerprint(format=writer.format_name, classes=writer.classes, options=options, stats=stats)
    n_inputs = len(items) + len(input_failures)
    if opts.resume and append is None and not partial_path(out).exists() and out.exists():
        return _check_finished(out, fp, n_inputs)
    # Input lines the parser could not use come first (index -1: always in the kept prefix).
    bad_lines = [{**f.record(), "index": -1, "at": 0} for f in input_failures]
    st = (_resume_state(items, work_fn, writer, executor, fp, bad_lines, append, refuse=opts.resume) if resuming
          else _State(failures=bad_lines))
    if append is not None:  # a video's frames carry its index among the version's videos, never one taken
        st.videos_before = next_video_index(append.base.manifest.videos)
    if resuming and not st.resumed:  # nothing to continue: a fresh run, which takes each file's stat as it reads
        stats = input_rows(items)
        fp = Fingerprint(format=writer.format_name, classes=writer.classes, options=options, stats=stats)
    writer.open(resume_samples=st.samples if st.resumed else None)
    writer.fingerprint = fp.to_dict()
    try:
        save_inputs(writer.resume_state_path().parent, stats)
    except OSError as e:
        raise WriteError(f"{out}: cannot save the input table ({e.strerror or e})") from e
    # A resumed --overwrite run may still replace the old output it was started over.
    overwrite = opts.overwrite or st.overwrite
    seen: list[int] | None = [] if not st.resumed else None  # size, mtime_ns per item read (flat)
    cp = _Checkpointer(writer.resume_state_path(), fp.to_dict(), st.items_done, st.samples, st.failures, st.entries,
                       overwrite, stats=seen, base=append.base_identity() if append is not None else None)
    def durable(n: int) -> None:  # a run whose claim was broken stops at its next commit
        check_claim()
        cp.durable(n)

    writer.on_durable = durable
    cp.save()  # also after a resume: a retried failure may have cut the output back
    shown = start
    try:
        with tqdm(total=len(items), initial=st.items_done, unit=unit, desc=desc, dynamic_ncols=True,
                  disable=None) as bar:
            # (the names a loop of millions of items looks up bound once)
            # (pending and seen take two ints an item, not a tuple that outlives the item: every
            # surviving container is work for the garbage collector)
            processed, add, update = cp.pending.extend, writer.add, None if bar.disable else bar.update
            record = None if seen is None else seen.extend
            index = st.items_done
            for outcome in executor.map_runs(work_fn, items[st.items_done:]):
                if type(outcome) is StoredSamples:  # inputs whose samples the workers stored
                    done = _add_stored(index, outcome, items, writer, processed, record)
                else:
                    value, done = outcome.value, 1
                    if outcome.ok and type(value) is Sample:  # the common case, as _store does it
                        add(value)
                        if record is not None:
                            record(value.source_stat or item_stat(items[index]))
                    else:
                        _store(index, items[index], outcome, writer, st)
                        if record is not None:
                            record(item_stat(items[index]))
                    processed((index, writer.count))
                index += done
                if update is not None:
                    update(done)
                if sample_unit is not None and time.monotonic() - shown > 0.5:
                    shown = time.monotonic()
                    bar.set_postfix_str(f"{(writer.count - st.samples) / (shown - start):.0f} {sample_unit}/s",
                                        refresh=False)
            if all_in is not None:
                all_in()
            writer.flush()
        if seen is not None:  # the files' digest, now that every input's size and mtime is known
            stats = [[*row, size, mtime] for row, size, mtime in zip(stats, seen[0::2], seen[1::2])]
            writer.fingerprint = fp.with_files(stats).to_dict()
            if append is None:  # the checkpoint holds it before the input table goes: a kill from
                cp.fp = writer.fingerprint  # here to the publish resumes on the digest alone
                cp.save()
        writer.sources = _sample_sources(stats, st, writer.count)
        if append is not None:  # the published version's: this run's, chained to the version it continued
            writer.fingerprint = append.fingerprint(writer.fingerprint)
        for name in (INPUTS_NAME, INPUT_STATS_NAME) if append is None else ():  # (an append's go at its publish)
            (writer.resume_state_path().parent / name).unlink(missing_ok=True)
        manifest = writer.close(failures=[_public(f) for f in st.failures],
                                videos=[_public(e) for e in st.entries], overwrite=overwrite,
                                counted=counted_failures(st.failures, strict=opts.strict))
    except BaseException:
        writer.abort()
        check_claim()  # a write that failed because another run took the output says so
        raise
    return Report(str(out), count=manifest.count, items=n_inputs,
                  failures=[_public(f) for f in st.failures], elapsed=time.monotonic() - start,
                  bytes=writer.bytes_written, status="appended" if append is not None else
                  "resumed" if st.resumed else "done", strict=opts.strict, version=manifest.version,
                  added=writer.count, note=append.note() if append is not None else "")


def _sample_sources(stats: list[list[Any]], st: _State, count: int) -> Any:
    """Per stored sample, ``(size, mtime_ns, label)`` of its input (``sources.bin``: what
    ``--append`` compares inputs with), from the per-input rows: every input but the failed
    ones gave one sample; a video (a manifest entry) gave its ``length``, each with its row.
    None when that is not so (multi-label items)."""
    import numpy as np

    if st.entries:
        return _video_sources(stats, st.entries, count)
    if len(stats) < count or any(len(row) != 4 for row in stats[:1]):
        return None
    failed = {f["index"] for f in st.failures if f.get("index", -1) >= 0 and not f.get("note")}
    rows = [(row[2], row[3], row[1]) for i, row in enumerate(stats) if i not in failed]
    if len(rows) != count:
        return None
    try:
        return np.array(rows, dtype=np.int64).reshape(count, 3)
    except (TypeError, ValueError):  # a multi-label item's list of labels
        return None


def _video_sources(stats: list[list[Any]], entries: list[dict[str, Any]], count: int) -> Any:
    """``_sample_sources`` of a video run: each video's row for each of its samples."""
    import numpy as np

    if sum(int(e["length"]) for e in entries) != count or any(len(row) != 4 for row in stats[:1]):
        return None
    try:
        rows = np.array([(stats[e["index"]][2], stats[e["index"]][3], stats[e["index"]][1]) for e in entries],
                        dtype=np.int64).reshape(len(entries), 3)
    except (TypeError, ValueError):  # a multi-label video's list of labels
        return None
    return np.repeat(rows, [int(e["length"]) for e in entries], axis=0)
