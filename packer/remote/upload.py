"""Writing outputs to URLs: build in a local staging folder, then upload each finished file,
the manifest last (so a partial upload is never a dataset), resumable.

``staged_output(url, resume=..., overwrite=...)`` gives a conversion its local path; when
the conversion has finished, ``StagedOutput.upload()`` uploads it (``--resume`` after a kill
skips the files already uploaded: a journal beside the staging output records each one with
its size and sha256, and the object must still be there with that size). The staging copy
is deleted after a complete upload; a marker records that it was complete.

Order: data files, then the per-file hash list (``packer.sha256`` inside a folder output,
``{file}.sha256`` beside a single file, in ``sha256sum`` format, so readers check every
download), then ``packer.json`` (folder outputs) or the ``.h5`` file itself (its manifest is
inside it).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from packer.errors import UsageError
from packer.manifest import MANIFEST_NAME, atomic_write_bytes
from packer.remote.cache import default_cache_dir
from packer.remote.fetch import RemoteMissing, RetryPolicy, file_sha256, retrying
from packer.remote.source import SUMS_NAME
from packer.remote.url import cache_key, is_url, join_url, redact, secrets_of, url_filesystem

__all__ = ["StagedOutput", "staged_output", "upload_output", "UploadReport", "remote_exists"]

log = logging.getLogger(__name__)


@dataclass
class UploadReport:
    """What an upload did."""

    url: str
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes: int = 0

    def summary(self) -> str:
        return (f"{redact(self.url)}: uploaded {len(self.uploaded)} files ({self.bytes / 1e6:.1f} MB)"
                + (f", {len(self.skipped)} already there" if self.skipped else ""))


def _files(local: Path) -> list[tuple[str, Path]]:
    """(name, path) of an output's files in upload order (manifest-bearing file last)."""
    if local.is_file():
        return [(local.name, local)]
    names = sorted(p.relative_to(local).as_posix() for p in local.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(local).parts))
    names = [n for n in names if n not in (MANIFEST_NAME, SUMS_NAME)]
    return [(n, local / n) for n in names]


def remote_exists(url: str, storage_options: dict[str, Any] | None = None) -> bool:
    """True when a finished packed output is at ``url`` (its manifest, or the single file)."""
    fs, path = url_filesystem(url, storage_options)
    target = path if url.lower().endswith((".h5", ".hdf5", ".hdf", ".he5")) else join_url(path, MANIFEST_NAME)
    try:
        return bool(fs.exists(target))
    except FileNotFoundError:
        return False


def upload_output(local: str | os.PathLike, url: str, *, storage_options: dict[str, Any] | None = None,
                  resume: bool = False, policy: RetryPolicy = RetryPolicy(),
                  on_file: Callable[[str], None] | None = None) -> UploadReport:
    """Upload the finished output ``local`` to ``url`` (a folder URL, or the file's URL).

    With ``resume`` the files a previous, interrupted upload of the same output finished are
    kept (journal + remote size check). ``on_file(name)`` is called after each file lands.
    """
    local = Path(local)
    if not local.exists():
        raise UsageError(f"{local}: nothing to upload")
    fs, rbase = url_filesystem(url, storage_options, timeout=policy.timeout)
    secrets = secrets_of(url, storage_options)
    single = local.is_file()
    journal_path = local.with_name(f".{local.name}.upload.json")
    journal: dict[str, dict[str, Any]] = {}
    if resume and journal_path.is_file():
        try:
            journal = json.loads(journal_path.read_text())
        except ValueError:
            journal = {}
    elif journal_path.exists():
        journal_path.unlink()
    report = UploadReport(url)
    if single:
        rdir, fname = rbase.rsplit("/", 1)
        udir = url.rsplit("/", 1)[0]
    else:
        rdir, fname, udir = rbase, None, url

    def rpath(name: str) -> str:
        return join_url(rdir, name)

    def put(name: str, path: Path) -> None:
        size = path.stat().st_size
        entry = journal.get(name)
        if entry and entry.get("bytes") == size:
            try:
                there = retrying(redact(join_url(udir, name)), lambda: fs.info(rpath(name)),
                                 policy=policy, secrets=secrets)
                if int(there.get("size", -1)) == size:
                    report.skipped.append(name)
                    return
            except RemoteMissing:
                pass
        digest = entry["sha256"] if entry and entry.get("bytes") == size and "sha256" in entry else file_sha256(path)
        retrying(redact(join_url(udir, name)), lambda: fs.put_file(str(path), rpath(name)),
                 policy=policy, secrets=secrets)
        journal[name] = {"bytes": size, "sha256": digest}
        atomic_write_bytes(journal_path, json.dumps(journal).encode())
        report.uploaded.append(name)
        report.bytes += size
        if on_file is not None:
            on_file(name)

    extras: list[tuple[str, Path]] = []
    if single:
        fail = local.with_name(local.name + ".failures.jsonl")
        data = [(fail.name, fail)] if fail.is_file() else []
        main_file = [(local.name, local)]
    else:
        data = _files(local)
        main_file = [(MANIFEST_NAME, local / MANIFEST_NAME)]
        if not main_file[0][1].is_file():
            raise UsageError(f"{local}: no {MANIFEST_NAME} (not a finished packer output)")
    if not resume:
        try:  # a dataset already there stops being one before its files change
            fs.rm_file(rpath(main_file[0][0]))
        except (FileNotFoundError, OSError):
            pass
    with tqdm(total=len(data) + 2, unit="file", desc="upload", dynamic_ncols=True, disable=None) as bar:
        for name, path in data:
            put(name, path)
            bar.update(1)
        # the hash list: every file's sha256, from the journal (computed once, while uploading)
        hashes = {name: journal[name]["sha256"] for name, _ in data}
        main_name, main_path = main_file[0]
        hashes[main_name] = file_sha256(main_path) if single else None
        lines = "".join(f"{h}  {n}\n" for n, h in sorted(hashes.items()) if h)
        sums_name = f"{main_name}.sha256" if single else SUMS_NAME
        sums_path = local.with_name(sums_name) if single else local / SUMS_NAME
        atomic_write_bytes(sums_path, lines.encode())
        put(sums_name, sums_path)
        bar.update(1)
        put(main_name, main_path)
        bar.update(1)
    journal_path.unlink(missing_ok=True)
    log.info("%s", report.summary())
    return report


@dataclass
class StagedOutput:
    """A conversion's output that goes to ``url``: build it at ``local``, then ``upload()``."""

    url: str | None
    local: Path
    resume: bool = False
    storage_options: dict[str, Any] | None = None
    complete: bool = False  # the upload finished earlier (a --resume has nothing to do)

    @property
    def remote(self) -> bool:
        return self.url is not None

    def upload(self, *, on_file: Callable[[str], None] | None = None) -> UploadReport | None:
        """Upload the finished staging output, then drop the staging copy (a local output: no-op)."""
        if self.url is None:
            return None
        report = upload_output(self.local, self.url, storage_options=self.storage_options, resume=self.resume,
                               on_file=on_file)
        marker = self.local.parent / ".uploaded"
        atomic_write_bytes(marker, json.dumps({"url": redact(self.url)}).encode())
        for p in (self.local, self.local.with_name(self.local.name + ".failures.jsonl"),
                  self.local.with_name(self.local.name + ".sha256")):
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        return report


def staged_output(out: str | os.PathLike, *, resume: bool = False, overwrite: bool = False,
                  storage_options: dict[str, Any] | None = None,
                  staging_dir: str | os.PathLike | None = None, fresh: bool = False) -> StagedOutput:
    """Where to build ``out``: itself when local; for a URL, a staging folder
    (``staging_dir``, ``$PACKER_STAGING_DIR`` or ``{cache}/staging``) keyed by the URL.

    Refuses before any work when a dataset is already at the URL and neither ``resume`` nor
    ``overwrite`` is given. ``fresh`` drops what an earlier run left in staging (for work that
    is not resumable, like a merge).
    """
    if not is_url(out):
        return StagedOutput(None, Path(out))
    url = str(out).rstrip("/")
    base = Path(staging_dir or os.environ.get("PACKER_STAGING_DIR") or default_cache_dir() / "staging")
    folder = base / cache_key(url)
    folder.mkdir(parents=True, exist_ok=True)
    local = folder / url.rsplit("/", 1)[-1]
    marker = folder / ".uploaded"
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    if resume and overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    there = remote_exists(url, storage_options)
    if there and not (resume or overwrite):
        raise UsageError(f"{redact(url)}: a dataset is already there (use --overwrite to replace it or "
                         "--resume to continue)")
    if overwrite and marker.exists():
        marker.unlink()
    complete = resume and there and marker.exists() and not local.exists()
    if not resume and not overwrite and local.exists():
        raise UsageError(f"{local}: a staging copy of {redact(url)} is there from an interrupted run "
                         "(use --resume to continue it or --overwrite to start again)")
    return StagedOutput(url, local, resume=resume, storage_options=storage_options, complete=complete)
