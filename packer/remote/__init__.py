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

from packer.formats.lazy import lazy_exports, resolve
from packer.remote.url import is_url, redact

__all__ = ["open_reader", "NodeCache", "cache_events", "default_cache_dir", "RemoteError", "RemoteMissing",
           "RetryPolicy", "RemoteOptions", "RemoteSource", "open_remote", "is_url", "redact"]


def open_reader(path: str | os.PathLike | list | tuple, *, check_crc: bool = True, remote: Any = None,
                version: int | None = None) -> Any:
    """Open any packed output by local path or URL; the manifest chooses the reader.

    A URL (``s3://``, ``https://``, anything fsspec resolves) is read through the node cache as
    ``remote`` (a ``RemoteOptions``) says; a local path, or a list of TFRecord files written by
    other tools, is opened by ``packer.formats.open_reader``. ``version``: of an output that was
    appended to, the version to read (None: the latest; local outputs only, docs/append.md).
    """
    if is_url(path):
        if version is not None:
            from packer.errors import UsageError

            raise UsageError(f"{redact(str(path))}: version= is for local outputs (at a URL the latest "
                             "version is read); see docs/append.md")
        return open_remote(path, check_crc=check_crc, options=remote)
    from packer.formats import open_reader as open_local

    return open_local(path, check_crc=check_crc, version=version)


def open_remote(url: str, *, check_crc: bool = True, options: Any = None) -> Any:
    """A Reader over the packed output at ``url`` (a format whose spec says how it is fetched),
    through the cache."""
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
    """The manifest's format says how its files are fetched (its ``FormatSpec.fetch``)."""
    from packer.errors import FormatError, UsageError
    from packer.formats import format_spec, format_specs
    from packer.manifest import MANIFEST_NAME, Manifest
    from packer.remote.fetch import RemoteMissing
    from packer.remote.source import SUMS_NAME, RemoteOptions, RemoteSource, parse_sums

    options = options or RemoteOptions()
    source = RemoteSource(url, options)
    try:
        text = source.refresh_manifest()
    except RemoteMissing:
        return _open_single_file(source, check_crc=check_crc)
    manifest = Manifest.from_json(text, redact(source.name_url(MANIFEST_NAME)))
    source.sums = parse_sums(source.optional_text(SUMS_NAME) or "")
    try:
        spec = format_spec(manifest.format)
    except FormatError:
        raise FormatError(f"{redact(url)}: format {manifest.format!r} is not read over URLs") from None
    if spec.fetch == "shards":
        from packer.remote.records import RemoteRecordsReader

        if manifest.created_by.get("foreign"):
            raise FormatError(f"{redact(url)}: foreign TFRecord folders are read locally only")
        return RemoteRecordsReader(source, check_crc=check_crc)
    if options.access == "range" and not spec.ranged:
        ranged = " or ".join(s.name for s in format_specs() if s.ranged)
        raise UsageError(f"{redact(url)}: access='range' is for {ranged} outputs, this one is {manifest.format}")
    if spec.fetch == "whole":
        for name in (*spec.sidecars, *spec.data):
            source.fetch(name)
        for name in spec.optional:
            _fetch_optional(source, name)
        return resolve(spec.reader)(source.local_root, check_crc=check_crc)
    if spec.refusal:
        raise UsageError(f"{redact(url)}: {spec.refusal}")
    raise FormatError(f"{redact(url)}: format {manifest.format!r} is not read over URLs")


def _fetch_optional(source: Any, name: str) -> None:
    from packer.remote.fetch import RemoteMissing

    try:
        source.fetch(name)
    except RemoteMissing:
        pass


def _open_single_file(source: Any, *, check_crc: bool):
    """A single-file output (HDF5) has no manifest beside it: fetched whole, the optional files
    its format names beside it when there (hash from ``{file}.sha256`` when uploaded by packer)."""
    from packer.formats import format_specs, single_file_spec
    from packer.manifest import MANIFEST_NAME
    from packer.remote.fetch import RemoteMissing
    from packer.remote.source import RemoteSource, parse_sums

    base, name = source.url.rsplit("/", 1)
    spec = single_file_spec(name)
    if spec is None:
        files = " or ".join(f"{s.suffixes[0]}" for s in format_specs() if s.single_file)
        raise RemoteMissing(f"{redact(source.name_url(MANIFEST_NAME))}: not found (and {redact(source.url)} "
                            f"is no {files} file): not a packed dataset")
    parent = RemoteSource(base, source.options)
    sums = parent.optional_text(f"{name}.sha256")
    parent.sums = parse_sums(sums or "")
    # No manifest to compare: the hash list (else the server's size and stamp) says whether the
    # file at this URL is still the one cached; a rewritten file is fetched again, never reused.
    parent.refresh_identity(f"{name}.identity", sums if sums is not None else parent.stamp(name))
    path = parent.fetch(name)
    for beside in spec.beside(name):
        _fetch_optional(parent, beside)
    reader = resolve(spec.reader)
    for part in reader.files_beside(path):  # an appended output's part files (docs/append.md)
        parent.fetch(part)
    return reader(path, check_crc=check_crc)


__getattr__ = lazy_exports(__name__, {
    "NodeCache": "packer.remote.cache", "cache_events": "packer.remote.cache",
    "default_cache_dir": "packer.remote.cache", "RemoteError": "packer.remote.fetch",
    "RemoteMissing": "packer.remote.fetch", "RetryPolicy": "packer.remote.fetch",
    "RemoteOptions": "packer.remote.source", "RemoteSource": "packer.remote.source",
})
