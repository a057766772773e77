"""``--append`` to an output at a URL: the new version is made in staging, its new objects are
uploaded, the manifest is swapped last (docs/append.md, "An output at a URL").

``staged_append(url)`` gives the append its local path: a *mirror* of the output's small files
(``packer.json``, ``keys.json``, ``sources.bin``, ``failures.jsonl``, the hash list and the
version's ``versions/{n}.json``; no shard, no index) in the staging folder a URL output is built
in (docs/remote.md). The append runs there as it does on a local output (packer.conversion.append
plans it from the mirror: the inputs not in the output yet by the resume identity, the options
and labels checked) and publishes the next version locally; a records append never reads the
shards already there. ``upload_version`` then uploads, in this order:

1. the new objects: the new shards and their ``.idx`` (already, while the conversion ran), the
   version's ``versions/{n}.json`` (and the one it continues, if the URL lacks it);
2. the hash list (``packer.sha256``: the earlier entries kept, the new objects added, the
   sidecars an append rewrites left out);
3. the sidecars an append rewrites in place, which only grow (``keys.json``, ``sources.bin``,
   ``failures.jsonl``: the same values for the positions an earlier version holds);
4. last, ``packer.json``, after checking that the URL still holds the version appended to.

No object an earlier version reads is replaced by other bytes: shards and indexes are never
written again, and a reader opened at the URL before step 4 reads the earlier version (its
manifest checks the grown ``keys.json`` of its positions) or, where it met the hash list change
under it, raises ``OutputChanged`` (``packer.remote.source``), never a mix. The hash list goes up
before the files it stops listing: a reader never finds a listed file with other bytes.

A kill anywhere leaves the earlier version at the URL as it was (new objects not yet in any
manifest are never read; a rerun uploads them again under the same names); rerunning the
``--append`` continues from the staging copy: the conversion's checkpoint, or the version already
published in staging, whose upload skips what the journal shows is up. The claim is the staging
copy's, as for any URL output: one writer per staging folder; a URL that changed under the
append (another writer) is refused at step 4, not overwritten.

LMDB and HDF5 outputs at a URL are single objects to their readers (``data.mdb``, the ``.h5``
file), which an append would upload again whole and replace under them: refused, with the
advice to append to a local copy and upload that.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

from tqdm import tqdm

from packer.errors import UsageError
from packer.formats.sidecars import CHECKSUMS_FILE, KEYS_FILE, SOURCES_FILE
from packer.manifest import FAILURES_NAME, MANIFEST_NAME, VERSIONS_DIR, Manifest, atomic_write_bytes
from packer.remote.fetch import RemoteMissing, RetryPolicy
from packer.remote.source import SUMS_NAME, parse_sums
from packer.remote.upload import (MIRROR_MARK, StagedOutput, UploadReport, _files, _single, _Uploader,
                                  remote_exists, staged_output, staging_path)
from packer.remote.url import join_url, redact

__all__ = ["AppendedOutput", "staged_append", "upload_version", "as_url", "refused", "REWRITTEN"]

log = logging.getLogger(__name__)

#: the sidecars an append rewrites in place (they only grow): never in an appended output's hash list
REWRITTEN = frozenset({KEYS_FILE, SOURCES_FILE, CHECKSUMS_FILE, FAILURES_NAME})

_WHOLE = {"lmdb": "an LMDB output at a URL is one data.mdb object, which an append would upload again "
                  "whole and replace under its readers",
          "hdf5": "an HDF5 output at a URL is one .h5 object (read whole), which an append would upload "
                  "again as a part and replace by a head file"}


def refused(url: str | os.PathLike, fmt: str) -> UsageError:
    """The error refusing an ``--append`` at ``url`` to a ``fmt`` output (records only)."""
    why = _WHOLE.get(fmt, f"--append to a URL is for records outputs, this one is {fmt}")
    return UsageError(f"{redact(str(url))}: --append to a URL is not supported yet for {fmt} outputs: {why}; "
                      "append to a local copy, then upload it (docs/append.md)")


class AppendedOutput(StagedOutput):
    """The staging mirror an append publishes the output's next version in: ``upload()`` sends
    that version's objects, the manifest last (``upload_version``)."""

    def _send(self, on_file: Callable[[str], None] | None) -> UploadReport:
        return upload_version(self.local, str(self.url), storage_options=self.storage_options, on_file=on_file)


def _get(up: _Uploader, name: str) -> bytes | None:
    """The object ``name`` of the output at the URL (None: not there), read fresh."""
    try:
        return up._retry(name, lambda: up.fs.cat_file(join_url(up.rdir, name)))
    except RemoteMissing:
        return None


def _continues(text: str, there: str) -> bool:
    """Is the manifest ``text`` a later version of the output whose manifest is ``there``?"""
    mine, base = Manifest.from_json(text, MANIFEST_NAME), Manifest.from_json(there, MANIFEST_NAME)
    want = base.identity()
    return mine.version > base.version and any(h.get("version") == base.version and h.get("identity") == want
                                               for h in mine.history)


def staged_append(out: str | os.PathLike, *, storage_options: dict[str, Any] | None = None,
                  staging_dir: str | os.PathLike | None = None,
                  policy: RetryPolicy = RetryPolicy()) -> StagedOutput:
    """Where an ``--append`` to the output at URL ``out`` is made: the staging copy, a mirror of
    the output's small files (see the module docstring), kept when it is the URL's version or an
    unfinished upload of a later one (a rerun continues it), else made again. A URL with no
    output yet is a plain run's (``staged_output``, continuing an interrupted one); a staging copy
    of an unfinished plain run is refused (finish it with ``--resume`` first)."""
    url = str(out).rstrip("/")
    local = staging_path(url, staging_dir)
    mark = local.parent / MIRROR_MARK
    plain = dict(resume=True, storage_options=storage_options, staging_dir=staging_dir)
    if _single(url) is not None:  # a single-file output (HDF5) has no manifest beside it
        if remote_exists(url, storage_options):
            raise refused(url, _single(url).name)
        return staged_output(url, **plain)
    local.parent.mkdir(parents=True, exist_ok=True)
    up = _Uploader(local, url, storage_options, policy)
    raw = _get(up, MANIFEST_NAME)
    if raw is None:  # nothing there yet (or what a mirror was made of is gone): a plain run
        if mark.exists():  # an append's mirror and work of an output no longer there
            for path in (local, Path(f"{local}.partial")):
                shutil.rmtree(path, ignore_errors=True)
            up.journal_path.unlink(missing_ok=True)
            mark.unlink()
        return staged_output(url, **plain)
    there = raw.decode("utf-8")
    fmt = Manifest.from_json(there, redact(join_url(url, MANIFEST_NAME))).format
    if fmt != "records":
        raise refused(url, fmt)
    if not mark.exists() and (local.exists() or Path(f"{local}.partial").exists()):
        raise UsageError(f"{local}: a staging copy of {redact(url)} is there from an interrupted run; finish "
                         "it with --resume (or start again with --overwrite), then append")
    mine = (local / MANIFEST_NAME).read_text(encoding="utf-8") if (local / MANIFEST_NAME).is_file() else None
    if mine is not None and (mine == there or _continues(mine, there)):
        log.info("%s: continuing the append staged at %s", redact(url), local)
    else:
        mark.write_text(json.dumps({"url": redact(url)}))  # first: what is made here is a mirror
        _mirror(up, local, there)
    (local.parent / ".uploaded").unlink(missing_ok=True)  # (a plain --resume's "nothing to do" marker)
    return AppendedOutput(url, local, storage_options=storage_options)


@contextlib.contextmanager
def as_url(staged: StagedOutput) -> Iterator[None]:
    """Errors an append refuses with name the output's URL, not its staging mirror."""
    try:
        yield
    except UsageError as e:
        if not isinstance(staged, AppendedOutput) or str(staged.local) not in str(e):
            raise
        raise UsageError(str(e).replace(str(staged.local), redact(str(staged.url)))) from e


def _mirror(up: _Uploader, local: Path, there: str) -> None:
    """Make ``local`` the mirror of the output's version ``there``: its small files, fetched
    fresh, checked to be that version's (the manifest read again after them), and the upload
    journal told they are on the server as they are."""
    tmp = local.with_name(f".{local.name}.mirror-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / VERSIONS_DIR).mkdir(parents=True)
    version = Manifest.from_json(there, MANIFEST_NAME).version
    kept = f"{VERSIONS_DIR}/{version}.json"
    journal: dict[str, dict[str, Any]] = {}
    for name in (KEYS_FILE, SOURCES_FILE, FAILURES_NAME, SUMS_NAME, kept):
        data = _get(up, name)
        if data is None:
            continue
        (tmp / name).write_bytes(data)
        if name != SUMS_NAME:
            journal[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if not (tmp / kept).is_file():  # a version 1 the URL keeps no copy of: the manifest as published
        (tmp / kept).write_text(there, encoding="utf-8")
    (tmp / MANIFEST_NAME).write_text(there, encoding="utf-8")
    if _get(up, MANIFEST_NAME) != there.encode("utf-8"):
        shutil.rmtree(tmp, ignore_errors=True)
        raise UsageError(f"{redact(up.url)}: changed while its files were read (another writer?); "
                         "nothing appended, run again")
    atomic_write_bytes(up.journal_path, json.dumps(journal).encode())
    if local.exists():
        shutil.rmtree(local)
    os.replace(tmp, local)


def upload_version(local: str | os.PathLike, url: str, *, storage_options: dict[str, Any] | None = None,
                   policy: RetryPolicy = RetryPolicy(),
                   on_file: Callable[[str], None] | None = None) -> UploadReport:
    """Upload the version an append published in the staging copy ``local`` to the output at
    ``url`` (the order of the module docstring, the manifest last); nothing when the URL has it
    already. UsageError, uploading no manifest, when the URL holds neither the version appended
    to nor this one (another writer changed it). ``on_file(name)`` is called after each file."""
    local = Path(local)
    up = _Uploader(local, url, storage_options, policy)
    main = local / MANIFEST_NAME
    text = main.read_text(encoding="utf-8")
    raw = _get(up, MANIFEST_NAME)
    there = raw.decode("utf-8") if raw is not None else None
    if there == text:
        return up.report
    if there is None or not _continues(text, there):
        raise UsageError(f"{redact(url)}: the output there is no longer the version this append continues "
                         "(replaced or appended to by another writer?); nothing published. Append again "
                         "to continue the output there")
    manifest = json.loads(text)
    known = {s["file"]: s["sha256"] for s in manifest.get("shards", []) if isinstance(s, dict) and s.get("sha256")}
    sums_path = local / SUMS_NAME
    listed = parse_sums(sums_path.read_text()) if sums_path.is_file() else {}
    data = _files(local)
    hashes: dict[str, str] = {}
    with tqdm(total=len(data) + 2, unit="file", desc="upload", dynamic_ncols=True, disable=None) as bar:
        def done(name: str) -> None:
            bar.update(1)
            if on_file is not None:
                on_file(name)

        for name, path in data:  # the new objects (and the earlier ones the journal shows up)
            if name not in REWRITTEN:
                hashes[name] = up.put(name, path, known.get(name))
                done(name)
        sums = {**{n: h for n, h in listed.items() if n not in REWRITTEN}, **hashes}
        atomic_write_bytes(sums_path, "".join(f"{h}  {n}\n" for n, h in sorted(sums.items())).encode())
        up.put(SUMS_NAME, sums_path)
        done(SUMS_NAME)
        for name, path in data:  # the grown sidecars, in place
            if name in REWRITTEN:
                up.put(name, path)
                done(name)
        # last, the swap: over the manifest this append continues only. Where the storage takes a
        # conditional write (S3) the server refuses it once another writer swapped its own in
        # since the ETag was read; elsewhere the re-read just before it narrows that window.
        etag = up.etag(MANIFEST_NAME)
        if _get(up, MANIFEST_NAME) != raw:
            raise UsageError(f"{redact(url)}: changed during the upload (another writer?); this version's "
                             "manifest was not published")
        up.put(MANIFEST_NAME, main, force=True, if_match=etag)
        done(MANIFEST_NAME)
    up.journal_path.unlink(missing_ok=True)
    log.info("%s", up.report.summary())
    return up.report
