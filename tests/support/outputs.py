"""What a reader sees of a packed output: two outputs are the same dataset when equal."""
from __future__ import annotations

from pathlib import Path

__all__ = ["packed_snapshot"]


def packed_snapshot(out) -> dict:
    """What a reader sees of a packed output of any format, plus its failures file: two outputs
    hold the same dataset when their snapshots are equal (``created_by`` may differ)."""
    import dataclasses

    from packer.formats import open_reader
    from packer.commands.merge import read_failures, writer_of

    r = open_reader(out)
    m = r.manifest
    return {"keys": list(r.keys), "records": [dataclasses.astuple(r.read(i)) for i in range(len(r))],
            "classes": m.classes, "kind": m.kind, "count": m.count, "failures": m.failures,
            "videos": m.videos, "extra": m.extra, "failure_records": read_failures(r),
            "failures_file": writer_of(r).failures_path(Path(out)).read_bytes()}
