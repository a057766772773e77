"""The table of conversion commands the fault suites run, and how to compare their outputs.

A new format joins through ``FORMATS`` (``to-{name}`` and ``decode-frames --to {name}``);
a new conversion command is one more ``Conversion`` row in :data:`CONVERSIONS`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from packer.formats import FORMATS, VIDEO_FORMATS, open_reader
from packer.formats.writer import Writer
from tests.support.inputs import write_image_folder, write_video_folder

# Data files whose bytes legitimately depend on the write history (LMDB page allocation after
# a resumed run); their content is compared through the reader instead.
HISTORY_DEPENDENT = {"data.mdb", "lock.mdb"}


@dataclass(frozen=True)
class Conversion:
    """One conversion command as the fault suites drive it: ``packer ARGV... SRC OUT OPTIONS``."""

    id: str
    command: tuple[str, ...]
    source: str  # "images" or "videos"
    writer: type[Writer]
    options: tuple[str, ...] = ()

    def out(self, root: Path, name: str = "out") -> Path:
        return root / (f"{name}.h5" if self.writer.single_file else f"{name}.{self.writer.format_name}")

    def argv(self, src: Path, out: Path, *more: Any) -> list[str]:
        return [*self.command, str(src), str(out), *self.options, "--max-failures", "9", *map(str, more)]

    def state(self, out: Path) -> Path:
        """The resume checkpoint of a run writing ``out``."""
        return self.writer(out, classes=[]).resume_state_path()


def _commit_args(name: str) -> tuple[str, ...]:
    """Small durable commits, so kills land between them: a records commit is a whole shard."""
    return ("--samples-per-shard", "4") if name == "records" else ("--commit-every", "4")


def _writer(name: str) -> type[Writer]:
    return {**FORMATS, **VIDEO_FORMATS}[name][0]


CONVERSIONS: list[Conversion] = [
    *[Conversion(f"to-{name}", (f"to-{name}",), "images", _writer(name), _commit_args(name))
      for name in FORMATS],
    *[Conversion(f"decode-frames-{to}", ("decode-frames",), "videos", _writer(to), ("--to", to, "--commit-every", "4" if to == "records" else "10"))
      for to in [*VIDEO_FORMATS, *FORMATS]],
]
def one_fast(convs: list[Conversion]) -> list:
    """``convs`` as pytest params: the first in the default run, the rest marked slow."""
    return [pytest.param(c, id=c.id, marks=() if i == 0 else pytest.mark.slow) for i, c in enumerate(convs)]




def make_source(kind: str, root: Path) -> Path:
    """A small input with one bad item: 30 images in 3 classes, or 4 videos in 2 classes."""
    if kind == "images":
        src = write_image_folder(root, count=30, classes=3, size=(40, 52))
        (src / "class_1" / "img_0013.jpg").write_bytes(b"broken")
    else:
        src = write_video_folder(root, per_class=2, classes=2, frames=12, size=(40, 52))
        (src / "class_1" / "broken.mp4").write_text("not a video")
    return src


def snapshot(conv: Conversion, out: Path) -> dict[str, Any]:
    """Everything that must match between two runs: every sample as read back, the manifest
    (without ``created_by``), ``failures.jsonl``, and the bytes of every index/sidecar file."""
    r = open_reader(out)
    samples = [r.read(i) for i in range(len(r))]
    manifest = json.loads(json.dumps(r.manifest.__dict__, default=str))
    manifest.pop("created_by", None)
    files = {}
    if out.is_dir():
        for p in sorted(out.rglob("*")):
            if p.is_file() and p.name not in HISTORY_DEPENDENT and p.name != "packer.json":
                files[p.relative_to(out).as_posix()] = p.read_bytes()
    r.close()
    return {"keys": list(r.keys), "manifest": manifest, "files": files,
            "samples": [(s.data, s.label, s.fmt, s.height, s.width, s.channels) for s in samples],
            "failures": conv.writer.failures_path(out).read_text()}


def leftovers(conv: Conversion, out: Path) -> list[str]:
    """Temporary files or folders a finished run left behind (there must be none)."""
    extra = [p.name for p in out.parent.iterdir()
             if p.name.startswith(out.name) and p != out and p != conv.writer.failures_path(out)]
    if out.is_dir():
        extra += [p.relative_to(out).as_posix() for p in out.rglob("*")
                  if p.name.startswith(".") or ".tmp" in p.name or p.name.endswith(".partial")]
    return extra


def flip_record_byte(shard: Path, record: int) -> None:
    """Flip one byte in the middle of TFRecord ``record`` of ``shard`` (its payload: a CRC32C
    mismatch on read, ``CorruptData`` naming the record)."""
    from packer.formats.records import index_path, read_index

    offsets, sizes = read_index(index_path(shard))
    at = int(offsets[record] + sizes[record] // 2)
    with open(shard, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0xFF]))
