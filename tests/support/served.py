"""Small helpers shared by the remote tests (packing a dataset into a served folder)."""
from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from packer.cli import main
from tests.support.inputs import write_image_folder


def pack(fmt: str, src: Path, out: Path, *extra: str) -> Path:
    """``packer to-{fmt} src out`` in this process (workers=0); asserts success."""
    result = CliRunner().invoke(main, [f"to-{fmt}", str(src), str(out), "--workers", "0", *extra])
    assert result.exit_code == 0, result.output
    return out


def records_dataset(www: Path, name: str, *, count: int = 40, per_shard: int = 7, seed: int = 0) -> Path:
    """A records output ``www/name`` of ``count`` JPEGs, ``per_shard`` per shard (source beside it)."""
    src = write_image_folder(www.parent / f"{name}-src", count=count, seed=seed)
    out = www / name
    if out.exists():
        shutil.rmtree(out)
    return pack("records", src, out, "--samples-per-shard", str(per_shard))
