"""Packed outputs in object storage: read ``http(s)://``, ``s3://`` (anything fsspec resolves)
through a node-local cache, and write outputs to URLs through a local staging folder.

``open_reader`` opens a packed output by local path or URL (a URL through ``open_remote``);
``RemoteOptions`` says how (cache folder and limit, storage options, prefetch, retries). See
docs/remote.md. The names are imported on first use, so opening a local path never loads the
remote machinery.
"""
from __future__ import annotations

import os
from typing import Any

from packer.formats.lazy import lazy_exports
from packer.remote.url import is_url, redact

__all__ = ["open_reader", "NodeCache", "cache_events", "default_cache_dir", "RemoteError", "RemoteMissing",
           "RetryPolicy", "RemoteOptions", "RemoteSource", "open_remote", "is_url", "redact"]


def open_reader(path: str | os.PathLike | list | tuple, *, check_crc: bool = True, remote: Any = None) -> Any:
    """Open any packed output by local path or URL; the manifest chooses the reader.

    A URL (``s3://``, ``https://``, anything fsspec resolves) is read through the node cache as
    ``remote`` (a ``RemoteOptions``) says; a local path, or a list of TFRecord files written by
    other tools, is opened by ``packer.formats.open_reader``.
    """
    if is_url(path):
        return open_remote(path, check_crc=check_crc, options=remote)
    from packer.formats import open_reader as open_local

    return open_local(path, check_crc=check_crc)


def open_remote(url: str, *, check_crc: bool = True, options: Any = None) -> Any:
    """A Reader over the packed output at ``url`` (records, lmdb or hdf5), through the cache."""
    from packer.errors import OutputChanged

    tries = 0
    while True:
        try:
            return _open_remote(url, check_crc=check_crc, options=options)
        except OutputChanged:  # republished while it was being opened: open the new version
            tries += 1
            if tries == 3:
                raise


def _open_remote(url: str, *, check_crc: bool, options: Any) -> Any:
    from packer.errors import FormatError, UsageError
    from packer.formats import FORMATS
    from packer.manifest import MANIFEST_NAME, Manifest
    from packer.remote.fetch import RemoteMissing
    from packer.remote.records import RemoteRecordsReader
    from packer.remote.source import SUMS_NAME, RemoteOptions, RemoteSource, parse_sums

    options = options or RemoteOptions()
    source = RemoteSource(url, options)
    try:
        text = source.refresh_manifest()
    except RemoteMissing:
        return _open_single_file(source, check_crc=check_crc)
    manifest = Manifest.from_json(text, redact(source.name_url(MANIFEST_NAME)))
    source.sums = parse_sums(source.optional_text(SUMS_NAME) or "")
    if manifest.format == "records":
        if manifest.created_by.get("foreign"):
            raise FormatError(f"{redact(url)}: foreign TFRecord folders are read locally only")
        return RemoteRecordsReader(source, check_crc=check_crc)
    if options.access == "range":
        raise UsageError(f"{redact(url)}: access='range' is for records outputs, this one is {manifest.format}")
    if manifest.format == "lmdb":
        for name in ("keys.json", "checksums.bin", "data.mdb"):
            source.fetch(name)
        _fetch_optional(source, "failures.jsonl")
        return FORMATS.reader("lmdb")(source.local_root, check_crc=check_crc)
    if manifest.format == "frames":
        raise UsageError(f"{redact(url)}: frame folders are not read over URLs (thousands of small files); "
                         "pack the frames as records (`packer decode-frames --to records`) and read that")
    raise FormatError(f"{redact(url)}: format {manifest.format!r} is not read over URLs")


def _fetch_optional(source: Any, name: str) -> None:
    from packer.remote.fetch import RemoteMissing

    try:
        source.fetch(name)
    except RemoteMissing:
        pass


def _open_single_file(source: Any, *, check_crc: bool):
    """An HDF5 output is one file: fetched whole (hash from ``{file}.sha256`` when uploaded by packer)."""
    from packer.formats import FORMATS
    from packer.manifest import MANIFEST_NAME
    from packer.remote.fetch import RemoteMissing
    from packer.remote.source import RemoteSource, parse_sums

    base, name = source.url.rsplit("/", 1)
    if not name.lower().endswith((".h5", ".hdf5", ".hdf", ".he5")):
        raise RemoteMissing(f"{redact(source.name_url(MANIFEST_NAME))}: not found (and {redact(source.url)} "
                            "is no .h5 file): not a packed dataset")
    parent = RemoteSource(base, source.options)
    sums = parent.optional_text(f"{name}.sha256")
    parent.sums = parse_sums(sums or "")
    # No manifest to compare: the hash list (else the server's size and stamp) says whether the
    # file at this URL is still the one cached; a rewritten file is fetched again, never reused.
    parent.refresh_identity(f"{name}.identity", sums if sums is not None else parent.stamp(name))
    path = parent.fetch(name)
    _fetch_optional(parent, f"{name}.failures.jsonl")
    return FORMATS.reader("hdf5")(path, check_crc=check_crc)


__getattr__ = lazy_exports(__name__, {
    "NodeCache": "packer.remote.cache", "cache_events": "packer.remote.cache",
    "default_cache_dir": "packer.remote.cache", "RemoteError": "packer.remote.fetch",
    "RemoteMissing": "packer.remote.fetch", "RetryPolicy": "packer.remote.fetch",
    "RemoteOptions": "packer.remote.source", "RemoteSource": "packer.remote.source",
})
