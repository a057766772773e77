"""What a packed format says about itself, without importing its writer or reader.

Each format package defines one ``FORMAT = FormatSpec(...)`` in its ``__init__.py``: its name,
its Writer and Reader (dotted paths, imported on first use), the files an output of it is made
of (data files, sidecars, whether it is one file) and how an output of it at a URL is fetched.
``packer.formats`` registers the package by name in one line, and everything outside
``formats/`` (``remote/``'s readers, upload and cache, the CLI's choices) asks the spec instead
of knowing formats by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from packer.manifest import FAILURES_NAME

__all__ = ["FormatSpec", "ShardFiles", "FETCH_MODES"]

# How an output at a URL is read (``packer.remote`` implements each):
#   "whole":  every file the spec names is fetched into the node cache at open, then read locally
#   "shards": the sidecars at open, each shard of the manifest's ``shards`` when first read
#   "file":   a single-file output, fetched whole at open (its sidecars beside it when present)
FETCH_MODES = ("whole", "shards", "file")


@dataclass(frozen=True)
class ShardFiles:
    """Data files the writer completes one at a time while a run goes on, so an upload can send
    each as soon as it is complete (a shard is complete once renamed into place after its
    ``companions`` are written)."""

    glob: str  # a completed shard in the working folder ("*.tfrecord"; hidden names are not complete)
    companions: tuple[str, ...]  # endings of files written beside each shard first (".idx")
    journal: str  # the writer's journal of completed shards: {"shards": [{file, bytes, sha256}]}


@dataclass(frozen=True)
class FormatSpec:
    """One packed format, as the code outside ``formats/`` needs to know it.

    Args:
        name: the format's name (the manifest's ``format``, ``--to``/``--write`` choices).
        writer, reader: ``"module:Class"`` of its Writer and Reader (imported on first use).
        suffixes: the file name endings of a single-file output (lower case, ``".h5"``); empty
            for a folder output.
        sidecars: the fixed-name metadata files inside a folder output, always there
            (``keys.json``); with ``optional`` and ``sidecar_suffixes`` they are what a cache
            never evicts.
        optional: fixed-name files that may be missing (``failures.jsonl``, written only when
            inputs failed); beside a single file they are ``{file}.{name}``.
        sidecar_suffixes: endings of the metadata file beside each data file (``".idx"``).
        data: fixed-name data files of a folder output (``data.mdb``); sharded outputs list
            theirs in the manifest's ``shards``.
        fetch: how an output at a URL is read (one of ``FETCH_MODES``); None: it is not.
        refusal: with ``fetch=None``, why not and what to do instead (a UsageError's text).
        ranged: its shards can be read one record per ranged request (``access="range"``).
        shards: the shards a running writer completes one by one (uploaded as they are done).
    """

    name: str
    writer: str
    reader: str
    suffixes: tuple[str, ...] = ()
    sidecars: tuple[str, ...] = ()
    optional: tuple[str, ...] = (FAILURES_NAME,)
    sidecar_suffixes: tuple[str, ...] = ()
    data: tuple[str, ...] = ()
    fetch: Optional[str] = None
    refusal: Optional[str] = None
    ranged: bool = False
    shards: Optional[ShardFiles] = None

    def __post_init__(self) -> None:
        if self.fetch is not None and self.fetch not in FETCH_MODES:
            raise ValueError(f"{self.name}: fetch must be one of {FETCH_MODES} or None, not {self.fetch!r}")
        if (self.fetch == "file") != self.single_file:
            raise ValueError(f"{self.name}: fetch='file' is for single-file formats (with suffixes), and only them")

    @property
    def single_file(self) -> bool:
        """True when an output is one file (its suffixes name it), not a folder."""
        return bool(self.suffixes)

    def names_file(self, name: str) -> bool:
        """True when file ``name`` is an output of this single-file format (by its ending)."""
        return self.single_file and name.lower().endswith(self.suffixes)

    def beside(self, name: str) -> tuple[str, ...]:
        """The optional files beside single-file output ``name`` (``{name}.failures.jsonl``)."""
        return tuple(f"{name}.{n}" for n in self.optional)
