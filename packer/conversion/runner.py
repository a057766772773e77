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
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm import tqdm

from packer.errors import PackerError, UsageError, WriteError
from packer.conversion.executors import Executor, InlineExecutor, Outcome
from packer.formats import Writer, open_reader
from packer.formats.base import Sample, partial_path
from packer.manifest import atomic_write_bytes
from packer.conversion.inputs import Item, fingerprint

__all__ = ["WorkResult", "Report", "run", "check_output_arg", "counted_failures"]

log = logging.getLogger(__name__)


@dataclass
class WorkResult:
    """What one item's work produced: samples to pack, an optional manifest entry (a video)
    and an optional note that does not fail the item (``stage: "partial"``)."""

    samples: list[Sample]
    entry: dict[str, Any] | None = None
    note: dict[str, Any] | None = None


@dataclass
class Report:
    """The outcome of a conversion."""

    out: str
    count: int = 0
    items: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0
    bytes: int = 0
    status: str = "done"  # done | resumed | complete
    strict: bool = False  # partial decodes count as failures

    @property
    def failed(self) -> int:
        """Failures that count toward --max-failures (partial decodes only with ``strict``)."""
        return counted_failures(self.failures, strict=self.strict)

    def summary(self) -> str:
        """One line for the terminal."""
        rate = self.count / self.elapsed if self.elapsed > 0 else 0.0
        if self.status == "complete":
            return f"{self.out}: already complete ({self.count} samples); nothing to do"
        return (f"{self.out}: {self.count} samples from {self.items} inputs, {self.failed} failed, "
                f"{self.bytes / 1e6:.1f} MB in {self.elapsed:.1f}s ({rate:.0f} samples/s)")


def counted_failures(failures: Sequence[dict[str, Any]], *, strict: bool = False) -> int:
    """How many failure records count toward --max-failures: all but partial decodes,
    which count only under ``strict`` (they stay ``stage: "partial"`` either way)."""
    return sum(1 for f in failures if strict or f.get("stage") != "partial")


def _as_result(value: Any) -> WorkResult:
    if isinstance(value, WorkResult):
        return value
    if isinstance(value, Sample):
        return WorkResult([value])
    return WorkResult(list(value))


def check_output_arg(out: str | os.PathLike, *, resume: bool, overwrite: bool) -> None:
    """Refuse before any work: an existing output needs --resume or --overwrite, not both."""
    if resume and overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    out = Path(out)
    if (out.exists() or out.is_symlink()) and not (resume or overwrite):
        raise UsageError(f"{out}: already exists (use --overwrite to replace it or --resume to continue)")
    if out.exists() and out.is_dir() and not out.is_symlink() and overwrite and any(out.glob("*")):
        # A directory that is not a packer output is never deleted by --overwrite.
        if not (out / "packer.json").exists():
            raise UsageError(f"{out}: exists and is not a packer output; refusing to overwrite it")


class _Checkpointer:
    """Tracks which input items are fully durable and writes the resume checkpoint."""

    def __init__(self, path: Path, fp: str, items_done: int, samples: int,
                 failures: list[dict[str, Any]], entries: list[dict[str, Any]], overwrite: bool):
        self.path = path
        self.fp = fp
        self.overwrite = overwrite
        self.items_done = items_done
        self.samples = samples
        self.failures = failures  # each with internal "index" and "at"
        self.entries = entries  # each with internal "index"
        self.pending: collections.deque = collections.deque()  # (item index, samples after it)

    def processed(self, index: int, samples_after: int) -> None:
        self.pending.append((index, samples_after))

    def durable(self, n: int) -> None:
        changed = False
        while self.pending and self.pending[0][1] <= n:
            index, after = self.pending.popleft()
            self.items_done, self.samples = index + 1, after
            changed = True
        if changed:
            self.save()

    def save(self) -> None:
        state = {"fingerprint": self.fp, "overwrite": self.overwrite, "items_done": self.items_done, "samples": self.samples,
                 "failures": [f for f in self.failures if f["index"] < self.items_done],
                 "entries": [e for e in self.entries if e["index"] < self.items_done]}
        try:
            atomic_write_bytes(self.path, json.dumps(state).encode())
        except OSError as e:
            raise WriteError(f"{self.path}: cannot save the resume checkpoint ({e.strerror or e})") from None


def _public(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("index", "at", "note")}


def run(items: Sequence[Item], work_fn: Callable[[Item], Any], writer: Writer, *,
        executor: Executor | None = None, max_failures: int = 0, resume: bool = False,
        overwrite: bool = False, strict: bool = False, unit: str = "img",
        desc: str = "packing", sample_unit: str | None = None) -> Report:
    """Run ``work_fn`` over ``items`` with ``executor`` and pack the results with ``writer``.

    Args:
        items: the inputs in packed order.
        work_fn: a picklable callable, item -> Sample | list[Sample] | WorkResult; raising
            ``CorruptSample`` (or anything) records a failure for that item.
        writer: an unopened Writer; ``run`` opens and closes it.
        executor: where work runs (inline when None).
        max_failures: failures tolerated before the Report counts as failed (the caller decides
            the exit status; every good sample is packed either way).
        resume: continue a partial output, or check a finished one and do nothing.
        overwrite: replace an existing output when done.
        strict: partial decodes (``WorkResult.note``) count as failures.
        sample_unit: when given, the progress bar also shows packed samples per second.
    Returns:
        a Report.
    """
    executor = executor or InlineExecutor()
    out = writer.out
    start = time.monotonic()
    fp = fingerprint(items)
    state_path = writer.resume_state_path()
    ckpt = None
    if resume and not partial_path(out).exists() and out.exists():
        reader = open_reader(out)
        log.info("%s is complete; checked its manifest, nothing to do", out)
        return Report(str(out), count=len(reader), items=len(items), status="complete")
    if resume and state_path.exists():
        ckpt = json.loads(state_path.read_text())
        if ckpt.get("fingerprint") != fp:
            raise UsageError(f"{out}: the input changed since the interrupted run; "
                             "use --overwrite to start again")

    failures: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    items_done = samples = 0
    if ckpt is not None:
        items_done, samples = ckpt["items_done"], ckpt["samples"]
        failures, entries = ckpt["failures"], ckpt["entries"]
        # Retry the prefix's failures; the first that now succeeds cuts the output back to it.
        # Notes (partial decodes) were packed, so they are kept as they are.
        retry = [f for f in failures if not f.get("note")]
        for f, outcome in zip(retry, executor.map(work_fn, [items[f["index"]] for f in retry])):
            if outcome.ok:
                items_done, samples = f["index"], f["at"]
                failures = [g for g in failures if g["index"] < items_done]
                entries = [e for e in entries if e["index"] < items_done]
                break
        log.info("resuming %s at input %d of %d (%d samples kept)", out, items_done, len(items), samples)

    writer.open(resume_samples=samples if ckpt is not None else None)
    # A resumed --overwrite run may still replace the old output it was started over.
    overwrite = overwrite or bool(ckpt and ckpt.get("overwrite"))
    cp = _Checkpointer(state_path, fp, items_done, samples, failures, entries, overwrite)
    writer.on_durable = cp.durable
    cp.save()  # also after a resume: a retried failure may have cut the output back
    shown = start
    try:
        with tqdm(total=len(items), initial=items_done, unit=unit, desc=desc, dynamic_ncols=True,
                  disable=None) as bar:
            todo = items[items_done:]
            for offset, outcome in enumerate(executor.map(work_fn, todo)):
                index = items_done + offset
                item = items[index]
                if outcome.ok:
                    result = _as_result(outcome.value)
                    first = writer.count
                    for sample in result.samples:
                        writer.add(sample)
                    if result.entry is not None:
                        entries.append({**result.entry, "start": first,
                                        "length": writer.count - first, "index": index})
                    if result.note is not None:
                        failures.append({"key": item.key, "source": item.path, "stage": "partial",
                                         **result.note, "index": index, "at": first, "note": True})
                else:
                    failures.append({"key": item.key, "source": item.path, "stage": outcome.stage,
                                     "reason": outcome.reason, "index": index, "at": writer.count})
                    log.warning("%s: %s", item.path, outcome.reason)
                cp.processed(index, writer.count)
                bar.update(1)
                if sample_unit is not None and time.monotonic() - shown > 0.5:
                    shown = time.monotonic()
                    bar.set_postfix_str(f"{(writer.count - samples) / (shown - start):.0f} {sample_unit}/s",
                                        refresh=False)
            writer.flush()
        manifest = writer.close(failures=[_public(f) for f in failures],
                                videos=[_public(e) for e in entries], overwrite=overwrite,
                                counted=counted_failures(failures, strict=strict))
    except BaseException:
        writer.abort()
        raise
    report = Report(str(out), count=manifest.count, items=len(items),
                    failures=[_public(f) for f in failures], elapsed=time.monotonic() - start,
                    bytes=writer.bytes_written, status="resumed" if ckpt is not None else "done",
                    strict=strict)
    return report
