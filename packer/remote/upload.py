"""Writing outputs to URLs: build in a local staging folder, upload each finished file, the
manifest last (so a partial upload is never a dataset), resumable.

``staged_output(url, resume=..., overwrite=...)`` gives a conversion its local path. While the
conversion runs, ``ShardUploader`` uploads each records shard (with its ``.idx``) as soon as
the writer completes it; when the conversion has finished, ``StagedOutput.upload()`` uploads
the rest. A journal beside the staging output (``.{name}.upload.json``) records every file
uploaded with its size and sha256; a file is skipped later only when the journal's sha256 is
the file's (the manifest's sha256 for a records shard, else hashed) and the object is on the
server with that size, so ``--resume`` after a kill uploads exactly what is missing or changed.
The staging copy is deleted after a complete upload; a marker records that it was complete.

Order: data files, then the per-file hash list (``packer.sha256`` inside a folder output,
``{file}.sha256`` beside a single file, in ``sha256sum`` format, so readers check every
download), then ``packer.json`` (folder outputs) or the single file itself (an ``.h5``: its
manifest is inside it). Which URLs name a single file, which files sit beside one and which
shards a running writer completes are the formats' own declarations (``FormatSpec``).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from packer.errors import UsageError
from packer.fileio import visible_files
from packer.formats import FormatSpec, ShardFiles, single_file_spec
from packer.manifest import MANIFEST_NAME, atomic_write_bytes
from packer.remote.cache import default_cache_dir
from packer.remote.fetch import RemoteError, RemoteMissing, RetryPolicy, file_sha256, http_status, retrying
from packer.remote.source import SUMS_NAME
from packer.remote.url import cache_key, is_url, join_url, redact, scrub, secrets_of, url_filesystem

__all__ = ["StagedOutput", "staged_output", "staging_path", "upload_output", "UploadReport", "remote_exists", "ShardUploader"]

log = logging.getLogger(__name__)

MIRROR_MARK = ".mirrored"  # beside a staging copy that mirrors the output at its URL (packer.remote.append)


def _single(url: str) -> FormatSpec | None:
    """The single-file format ``url`` names an output of (by its ending); None: a folder output."""
    return single_file_spec(url.rsplit("/", 1)[-1])


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
    """(name, path) of a folder output's data files (not the manifest or hash list), sorted.
    A folder of it that cannot be listed stops the upload with a UsageError naming it, rather
    than leave its files out."""
    def unlisted(e: OSError) -> None:
        raise UsageError(f"{e.filename or local}: cannot list this folder of the output "
                         f"({e.strerror or e}); nothing uploaded") from None

    names = sorted(rel.replace(os.sep, "/") for rel in visible_files(local, unlisted))
    return [(n, local / n) for n in names if n not in (MANIFEST_NAME, SUMS_NAME)]


def _main_name(url: str) -> str:
    """The file whose arrival makes the output a dataset: the manifest, or the single file."""
    return url.rstrip("/").rsplit("/", 1)[-1] if _single(url) else MANIFEST_NAME


def remote_exists(url: str, storage_options: dict[str, Any] | None = None) -> bool:
    """True when a finished packed output is at ``url`` (its manifest, or the single file)."""
    fs, path = url_filesystem(url, storage_options)
    target = path if _single(url) else join_url(path, MANIFEST_NAME)
    try:
        fs.info(target)  # not exists(): fsspec's HTTP exists() answers False for a server it cannot reach
    except FileNotFoundError as e:
        cause = e.__cause__
        if cause is None or isinstance(cause, FileNotFoundError) or getattr(cause, "status", None) in (404, 410):
            return False
        error: BaseException = cause  # fsspec's HTTP info() turns a failed connection into this
    except Exception as e:  # noqa: BLE001 - any client's connection or permission error
        error = e
    else:
        return True
    reason = scrub(" ".join(f"{type(error).__name__}: {error}".split()), secrets_of(url, storage_options))
    raise RemoteError(f"{redact(url)}: cannot use the storage ({reason}); nothing was written") from error


class _Uploader:
    """Puts files under one remote folder, journaled beside ``local`` (thread-safe)."""

    def __init__(self, local: Path, url: str, storage_options: dict[str, Any] | None, policy: RetryPolicy):
        self.url = url.rstrip("/")
        self.spec = _single(self.url)  # a single-file format's spec; None: a folder output
        self.single = self.spec is not None
        self.udir = self.url.rsplit("/", 1)[0] if self.single else self.url
        fs, rbase = url_filesystem(url, storage_options, timeout=policy.timeout)
        self.fs = fs
        self.rdir = rbase.rsplit("/", 1)[0] if self.single else rbase
        self.policy = policy
        self.secrets = secrets_of(url, storage_options)
        # HTTP(S): PUT, as WebDAV servers (nginx dav_methods) and presigned URLs take it (fsspec's default is POST)
        self.put_options = {"method": "put"} if self.url.lower().startswith(("http://", "https://")) else {}
        self.journal_path = local.with_name(f".{local.name}.upload.json")
        self.lock = threading.Lock()
        try:
            self.journal: dict[str, dict[str, Any]] = json.loads(self.journal_path.read_text())
        except (OSError, ValueError):
            self.journal = {}
        self.report = UploadReport(url)

    def _retry(self, name: str, fn: Callable[[], Any]) -> Any:
        return retrying(redact(join_url(self.udir, name)), fn, policy=self.policy, secrets=self.secrets)

    def uploaded(self, name: str, size: int, sha256: str) -> bool:
        """True when the journal has ``name`` with this content and the server has its size."""
        entry = self.journal.get(name)
        if not entry or entry.get("bytes") != size or entry.get("sha256") != sha256:
            return False
        try:
            there = self._retry(name, lambda: self.fs.info(join_url(self.rdir, name)))
        except RemoteMissing:
            return False
        return int(there.get("size", -1)) == size

    def etag(self, name: str) -> str | None:
        """The ETag of the object ``name`` where the storage takes a write conditional on it (S3's
        ``If-Match``), read fresh; None elsewhere."""
        if not set(_protocols(self.fs)) & {"s3", "s3a"}:
            return None
        remote = join_url(self.rdir, name)
        self.fs.invalidate_cache(remote)
        return self._retry(name, lambda: self.fs.info(remote)).get("ETag")

    def put(self, name: str, path: Path, sha256: str | None = None, *, force: bool = False,
            if_match: str | None = None) -> str:
        """Upload ``path`` as ``name`` unless already there with this content; its sha256.
        ``if_match``: the ``etag`` the object must still have, or the server refuses the write
        (``UsageError``: another writer replaced it since)."""
        size = path.stat().st_size
        sha256 = sha256 or file_sha256(path)
        if not force and self.uploaded(name, size, sha256):
            self.report.skipped.append(name)
            return sha256
        if if_match is None:
            self._retry(name, lambda: self.fs.put_file(str(path), join_url(self.rdir, name), **self.put_options))
        else:
            data = path.read_bytes()
            self._retry(name, lambda: self._put_if(name, data, if_match))
        with self.lock:
            self.journal[name] = {"bytes": size, "sha256": sha256}
            atomic_write_bytes(self.journal_path, json.dumps(self.journal).encode())
            self.report.uploaded.append(name)
            self.report.bytes += size
        return sha256

    def _put_if(self, name: str, data: bytes, etag: str) -> None:
        remote = join_url(self.rdir, name)
        try:
            self.fs.pipe_file(remote, data, IfMatch=etag)
        except OSError as e:
            cause = e.__cause__ if e.__cause__ is not None else e
            code = (getattr(cause, "response", None) or {}).get("Error", {}).get("Code")
            if code != "PreconditionFailed" and http_status(cause) != 412:
                raise
            self.fs.invalidate_cache(remote)
            if self.fs.cat_file(remote) == data:  # our own write, which landed before a retry of it
                return
            raise UsageError(f"{redact(join_url(self.udir, name))}: another writer replaced it while this one "
                             "was being written (the storage refused the conditional write); not overwritten") from e

    def remove_main(self) -> None:
        """Delete the remote manifest (or single file): what was there stops being a dataset."""
        try:
            self.fs.rm_file(join_url(self.rdir, _main_name(self.url)))
        except (FileNotFoundError, OSError):
            pass
        except NotImplementedError:  # fsspec's HTTP filesystem deletes nothing
            raise UsageError(f"{redact(self.url)}: this storage cannot delete files, so --overwrite cannot "
                             "unpublish the dataset there first; remove it on the server, then run again") from None


def upload_output(local: str | os.PathLike, url: str, *, storage_options: dict[str, Any] | None = None,
                  policy: RetryPolicy = RetryPolicy(),
                  on_file: Callable[[str], None] | None = None) -> UploadReport:
    """Upload the finished output ``local`` to ``url`` (a folder URL, or the file's URL).

    Files the journal shows already uploaded with the same content are skipped (see the module
    docstring). ``on_file(name)`` is called after each file is done.
    """
    local = Path(local)
    if not local.exists():
        raise UsageError(f"{local}: nothing to upload")
    up = _Uploader(local, url, storage_options, policy)
    if up.spec is not None:
        data = [(name, local.with_name(name)) for name in up.spec.beside(local.name) if local.with_name(name).is_file()]
        main_name, main_path = local.name, local
        sums_name, sums_path = f"{local.name}.sha256", local.with_name(f"{local.name}.sha256")
        known: dict[str, str] = {}
    else:
        main_name, main_path = MANIFEST_NAME, local / MANIFEST_NAME
        if not main_path.is_file():
            raise UsageError(f"{local}: no {MANIFEST_NAME} (not a finished packer output)")
        data = _files(local)
        sums_name, sums_path = SUMS_NAME, local / SUMS_NAME
        manifest = json.loads(main_path.read_text(encoding="utf-8"))
        known = {s["file"]: s["sha256"] for s in manifest.get("shards", []) if isinstance(s, dict) and s.get("sha256")}
    hashes: dict[str, str] = {}
    with tqdm(total=len(data) + 2, unit="file", desc="upload", dynamic_ncols=True, disable=None) as bar:
        for name, path in data:
            hashes[name] = up.put(name, path, known.get(name))
            bar.update(1)
            if on_file is not None:
                on_file(name)
        if up.single:
            hashes[main_name] = file_sha256(main_path)
        atomic_write_bytes(sums_path, "".join(f"{h}  {n}\n" for n, h in sorted(hashes.items())).encode())
        up.put(sums_name, sums_path)
        bar.update(1)
        up.put(main_name, main_path, hashes.get(main_name), force=True)  # last: now it is a dataset
        bar.update(1)
    up.journal_path.unlink(missing_ok=True)
    log.info("%s", up.report.summary())
    return up.report


class ShardUploader:
    """Uploads each records shard (and its ``.idx``) from a running conversion's working folder
    as soon as the writer completes it (a completed shard is renamed into place after its index
    is written), polling every ``interval`` seconds in a background thread."""

    def __init__(self, staged: "StagedOutput", *, interval: float = 1.0, policy: RetryPolicy = RetryPolicy()):
        from packer.formats import format_specs
        from packer.formats.sidecars import partial_path

        self.work = partial_path(staged.local)
        self.shards = [s.shards for s in format_specs() if s.shards is not None]
        self.up = _Uploader(staged.local, staged.url, staged.storage_options, policy)
        self.interval = interval
        self.seen: dict[str, tuple[int, int]] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="packer-upload", daemon=True)

    def __enter__(self) -> "ShardUploader":
        if not self.up.single:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan()
            except Exception as e:  # noqa: BLE001 - the final upload retries whatever failed here
                log.warning("background upload: %s (the final upload pass will retry)", e)
            self._stop.wait(self.interval)

    def scan(self) -> None:
        """Upload every completed shard not uploaded yet (shards as their formats declare them)."""
        if not self.work.is_dir():
            return
        for files in self.shards:
            self._scan(files)

    def _scan(self, files: ShardFiles) -> None:
        try:  # the writer's journal of completed shards already has their sha256
            journal = json.loads((self.work / files.journal).read_text())
            known = {e["file"]: (e["bytes"], e["sha256"]) for e in journal.get("shards", []) if "sha256" in e}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            known = {}
        for shard in sorted(self.work.glob(files.glob)):
            companions = [shard.with_name(shard.name + suffix) for suffix in files.companions]
            if shard.name.startswith(".") or not all(c.is_file() for c in companions) or self._stop.is_set():
                continue
            try:
                st = shard.stat()
            except FileNotFoundError:  # renamed away (the conversion finished) or cut by a resume
                continue
            if self.seen.get(shard.name) == (st.st_size, st.st_mtime_ns):
                continue
            for companion in companions:
                self.up.put(companion.name, companion)
            size, sha = known.get(shard.name, (None, None))
            self.up.put(shard.name, shard, sha if size == st.st_size else None)
            self.seen[shard.name] = (st.st_size, st.st_mtime_ns)


@dataclass
class StagedOutput:
    """A conversion's output that goes to ``url``: build it at ``local``, then ``upload()``."""

    url: str | None
    local: Path
    storage_options: dict[str, Any] | None = None
    complete: bool = False  # the upload finished earlier (a --resume has nothing to do)

    @property
    def remote(self) -> bool:
        return self.url is not None

    def uploading_shards(self, interval: float = 1.0) -> ShardUploader | None:
        """A context manager uploading finished shards while the conversion runs (None: local)."""
        return ShardUploader(self, interval=interval) if self.url is not None else None

    def _send(self, on_file: Callable[[str], None] | None) -> UploadReport:
        """Upload the finished staging output (an append's sends only its new version)."""
        return upload_output(self.local, self.url, storage_options=self.storage_options, on_file=on_file)

    def upload(self, *, on_file: Callable[[str], None] | None = None) -> UploadReport | None:
        """Upload the finished staging output, then drop the staging copy (a local output: no-op)."""
        if self.url is None:
            return None
        report = self._send(on_file)
        atomic_write_bytes(self.local.parent / ".uploaded", json.dumps({"url": redact(self.url)}).encode())
        spec = _single(self.url)
        beside = (*spec.beside(self.local.name), f"{self.local.name}.sha256") if spec is not None else ()
        for p in (self.local, *(self.local.with_name(name) for name in beside), self.local.parent / MIRROR_MARK):
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        return report


def staging_path(url: str, staging_dir: str | os.PathLike | None = None) -> Path:
    """Where the output at ``url`` is built locally: ``{staging}/{key of the URL}/{its name}``
    (``staging_dir``, else ``$PACKER_STAGING_DIR``, else ``{cache}/staging``)."""
    base = Path(staging_dir or os.environ.get("PACKER_STAGING_DIR") or default_cache_dir() / "staging")
    return base / cache_key(url) / url.rsplit("/", 1)[-1]


def staged_output(out: str | os.PathLike, *, resume: bool = False, overwrite: bool = False,
                  storage_options: dict[str, Any] | None = None,
                  staging_dir: str | os.PathLike | None = None, fresh: bool = False) -> StagedOutput:
    """Where to build ``out``: itself when local; for a URL, a staging folder
    (``staging_dir``, ``$PACKER_STAGING_DIR`` or ``{cache}/staging``) keyed by the URL.

    Refuses before any work when a dataset is already at the URL (or a staging copy from an
    interrupted run is here) and neither ``resume`` nor ``overwrite`` is given. ``overwrite``
    deletes the remote manifest at once (the old dataset stops being one before its files are
    replaced) and forgets earlier uploads. ``fresh`` drops what an earlier run left in staging
    (for work that is not resumable, like a merge).
    """
    if not is_url(out):
        return StagedOutput(None, Path(out))
    if resume and overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    url = str(out).rstrip("/")
    local = staging_path(url, staging_dir)
    folder = local.parent
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / ".uploaded"
    journal = local.with_name(f".{local.name}.upload.json")
    there = remote_exists(url, storage_options)
    if there and not (resume or overwrite):
        raise UsageError(f"{redact(url)}: a dataset is already there (use --overwrite to replace it or "
                         "--resume to continue)")
    if not overwrite and not fresh and (folder / MIRROR_MARK).exists():
        raise UsageError(f"{local}: an --append to {redact(url)} is staged there, unfinished; run it again "
                         "with --append to finish it (or --overwrite to start again)")
    if not resume and not overwrite and (local.exists() or Path(f"{local}.partial").exists()):
        raise UsageError(f"{local}: a staging copy of {redact(url)} is there from an interrupted run "
                         "(use --resume to continue it or --overwrite to start again)")
    if overwrite or fresh:
        marker.unlink(missing_ok=True)
        (folder / MIRROR_MARK).unlink(missing_ok=True)
        journal.unlink(missing_ok=True)
        if there:
            _Uploader(local, url, storage_options, RetryPolicy()).remove_main()
    complete = resume and there and marker.exists() and not local.exists()
    return StagedOutput(url, local, storage_options=storage_options, complete=complete)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
