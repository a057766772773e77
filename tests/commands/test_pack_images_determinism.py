"""What README promises about ``--workers``: the same input gives the same samples, keys,
labels and manifest whatever the worker count; LMDB outputs are byte-identical files (HDF5
files differ only in HDF5's own metadata, records shard boundaries follow the workers, so those
are compared through the reader)."""
from __future__ import annotations


import pytest

from packer.commands.pack_images import pack_images
from packer.formats import FORMATS
from packer.conversion.options import RunOptions
from tests.support.outputs import packed_snapshot

BYTE_IDENTICAL = {"lmdb"}


def _files(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_workers_do_not_change_the_output(fmt, image_folder, tmp_path):
    outs = []
    for workers in (0, 2):
        out = tmp_path / (f"w{workers}.h5" if FORMATS[fmt][0].single_file else f"w{workers}")
        pack_images(image_folder, out, format=fmt, run_options=RunOptions(workers=workers))
        outs.append(out)
    a, b = (packed_snapshot(o) for o in outs)
    assert len(a["records"]) == len(b["records"]) > 0
    assert a == b
    if fmt in BYTE_IDENTICAL:
        assert _files(outs[0]) == _files(outs[1])
