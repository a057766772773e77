"""``packer inspect`` and ``packer verify``: what a packed output holds, and whether it is intact."""
from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from packer.errors import CorruptData, PackerError
from packer.formats import Record
from packer.remote import open_reader
from packer.remote.source import RemoteOptions
from packer.remote.url import is_url
from packer.codecs.fields import BLOB_FMT
from packer.codecs.image import decode, sniff_format
from packer.codecs.video_pack import VIDEO_FMT, count_frames, index_mp4, pack_stream, unpack_stream
from packer.formats.videofiles import MP4_FMT

__all__ = ["inspect_dataset", "render_grid", "box_rectangle", "BOX_COLOURS", "verify_dataset", "VerifyResult",
           "disk_usage", "versions_of"]


def disk_usage(path: str | os.PathLike) -> int:
    """Bytes on disk of a file or every file below a folder."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _stored_bytes(path: str | os.PathLike, reader: Any) -> int:
    """Bytes on disk; for a URL, what the manifest lists (records shards) or the fetched copy."""
    from packer.remote.url import is_url

    if not is_url(path):
        return disk_usage(path)
    shards = reader.manifest.shards
    if shards and all("bytes" in s for s in shards):
        return sum(int(s["bytes"]) for s in shards)
    return disk_usage(reader.path)


def _field_summaries(schema: Any, blob: bytes) -> dict[str, str]:
    """One short line per field of a sample (a value, a shape, a size), never the whole value."""
    try:
        parts = schema.split(blob)
    except ValueError as e:
        return {"(blob)": f"malformed ({e})"}
    out = {}
    for f in schema.fields:
        data = parts[f.name]
        if f.type_name in ("image", "bytes"):
            out[f.name] = (f"{sniff_format(data)}, " if f.type_name == "image" else "") + f"{len(data)} bytes"
            continue
        try:
            value = f.decode(data)
        except ValueError as e:
            out[f.name] = f"undecodable ({e})"
            continue
        if isinstance(value, np.ndarray):
            out[f.name] = f"{value.dtype}{list(value.shape)}"
        elif f.type_name == "rle":
            out[f.name] = f"{len(value)} masks"
        elif f.type_name == "segmentation":
            out[f.name] = f"{len(value)} masks ({sum(isinstance(o, list) for o in value.objects)} as polygons)"
        else:
            text = repr(value)
            out[f.name] = text if len(text) <= 40 else text[:37] + "..."
    return out


def versions_of(m: Any) -> list[dict[str, Any]]:
    """Every version of an output, oldest first, as its manifest's ``history`` and its own fields
    say: number, parent, count, what it added and removed, the command that made it."""
    fields = ("version", "parent", "count", "added", "removed", "command")
    rows = [{k: h[k] for k in fields if k in h} for h in m.history]
    rows.append({k: v for k, v in (("version", m.version), ("parent", m.parent), ("count", m.count),
                                   ("added", m.added), ("removed", m.removed),
                                   ("command", m.created_by.get("command"))) if v not in (None, {})})
    return rows


def inspect_dataset(path: str | os.PathLike, *, show: int = 5) -> dict[str, Any]:
    """Format, count, classes, bytes on disk and the first ``show`` keys with their sizes; for a
    field pack also its schema (``fields``: name -> type), a COCO pack's category map
    (``categories``: ``[{label, id, name}]``) and each shown sample's fields, summarized."""
    reader = open_reader(path, check_crc=False)
    m = reader.manifest
    n = len(reader)
    schema = reader.schema
    samples = []
    for i in range(min(show, n)):
        rec = reader.read(i)
        sample = {"index": i, "key": reader.keys[i], "label": rec.label, "bytes": len(rec.data),
                  "format": rec.fmt, "height": rec.height, "width": rec.width, "channels": rec.channels}
        if schema is not None and rec.fmt == BLOB_FMT:
            sample["fields"] = _field_summaries(schema, rec.data)
        samples.append(sample)
    info = {"path": str(path), "format": m.format, "format_version": m.format_version, "kind": m.kind,
            "count": n, "classes": m.classes, "bytes_on_disk": _stored_bytes(path, reader), "failures": m.failures,
            "created_by": m.created_by, "samples": samples}
    if schema is not None:
        info["fields"] = {f.name: f.spec() for f in schema.fields}
        coco = m.extra.get("coco")
        if isinstance(coco, dict):
            info["coco_kind"] = coco.get("kind")
            info["categories"] = [{"label": k, **c} for k, c in enumerate(coco.get("categories") or [])]
    if m.videos:
        info["videos"] = len(m.videos)
    if m.shards:
        info["shards"] = len(m.shards)
    info["version"] = m.version
    info["versions"] = versions_of(m)
    return info


# box outlines by label (label modulo the palette): bright, far from each other and from greys
BOX_COLOURS = ((255, 64, 64), (64, 255, 64), (64, 160, 255), (255, 220, 0), (255, 0, 255), (0, 255, 255),
               (255, 140, 0), (160, 90, 255))


@dataclass
class _Tile:
    """What one contact-sheet tile shows: the image, its caption's second line and, for a
    detection pack, the boxes (xyxy in the image's pixels) and their labels."""

    image: np.ndarray | None
    caption: str
    boxes: np.ndarray | None = None
    labels: np.ndarray | None = None


def _tile(reader: Any, rec: Record) -> _Tile:
    """The tile of one sample: an image pack's image and class; a field pack's first image, its
    detection boxes and labels (``Schema.boxes``) or else its field count. ValueError when the
    sample does not decode."""
    schema = reader.schema
    if schema is None:
        cls = reader.classes[rec.label] if 0 <= rec.label < len(reader.classes) else str(rec.label)
        return _Tile(decode(rec.data), f"[{rec.label}] {cls}")
    parts = schema.split(rec.data)
    image = decode(bytes(parts[schema.image_fields[0]])) if schema.image_fields else None
    box_field = schema.boxes
    if box_field is None:
        return _Tile(image, f"{len(schema.fields)} fields")
    boxes = box_field.decode(parts[box_field.name])
    label_field = schema.by_name.get("labels")
    labels = label_field.decode(parts["labels"]) if label_field is not None and label_field.type_name == "ndarray" \
        else None
    if labels is not None and len(labels) != len(boxes):
        labels = None
    return _Tile(image, f"{len(boxes)} boxes", boxes, labels)


def box_rectangle(box: Any, scale: tuple[float, float], at: tuple[int, int]) -> tuple[int, int, int, int]:
    """The sheet pixels ``(left, top, right, bottom)``, inclusive, whose outline draws ``box``
    (xyxy in the image's pixels) on a thumbnail scaled by ``scale`` (x, y) pasted at ``at``:
    the first and last pixel each edge of the scaled box covers."""
    x0, y0, x1, y1 = (float(v) for v in box)
    left, top = at[0] + int(np.floor(x0 * scale[0])), at[1] + int(np.floor(y0 * scale[1]))
    right = max(left, at[0] + int(np.ceil(x1 * scale[0])) - 1)
    bottom = max(top, at[1] + int(np.ceil(y1 * scale[1])) - 1)
    return left, top, right, bottom


def render_grid(path: str | os.PathLike, out_png: str | os.PathLike, *, count: int = 16,
                seed: int = 0, tile: int = 160, boxes: bool = True, labels: bool = False) -> list[int]:
    """A contact sheet of a seeded random sample, each tile captioned with key and class.

    On a detection field pack (a ``boxes`` field, docs/fields.md) each tile shows the sample's
    boxes, outlined in a colour per label (``BOX_COLOURS``; ``box_rectangle`` places them), and
    with ``labels`` each box's class name; the caption gives the box count.

    Returns the sample positions shown.
    """
    reader = open_reader(path)
    n = len(reader)
    if n == 0:
        raise PackerError(f"{path}: empty dataset, nothing to draw")
    picks = sorted(random.Random(seed).sample(range(n), min(count, n)))
    cols = int(np.ceil(np.sqrt(len(picks))))
    rows = int(np.ceil(len(picks) / cols))
    caption = 28
    sheet = Image.new("RGB", (cols * tile, rows * (tile + caption)), (32, 32, 32))
    draw = ImageDraw.Draw(sheet)
    for k, i in enumerate(picks):
        rec = reader.read(i)
        try:
            shown = _tile(reader, rec)
        except ValueError:
            shown = _Tile(None, "undecodable")
        if shown.image is None:
            im = Image.new("RGB", (tile, tile), (128, 0, 0))
        else:
            im = Image.fromarray(shown.image)
            im.thumbnail((tile, tile))
        x, y = (k % cols) * tile, (k // cols) * (tile + caption)
        at = (x + (tile - im.width) // 2, y + (tile - im.height) // 2)
        sheet.paste(im, at)
        if boxes and shown.boxes is not None and shown.image is not None:
            scale = (im.width / shown.image.shape[1], im.height / shown.image.shape[0])
            for j, box in enumerate(shown.boxes):
                label = int(shown.labels[j]) if shown.labels is not None else 0
                colour = BOX_COLOURS[label % len(BOX_COLOURS)]
                rect = box_rectangle(box, scale, at)
                draw.rectangle(rect, outline=colour)
                if labels and shown.labels is not None:
                    name = reader.classes[label] if 0 <= label < len(reader.classes) else str(label)
                    draw.text((rect[0] + 2, rect[1] + 1), name[:16], fill=colour)
        key = reader.keys[i]
        draw.text((x + 3, y + tile + 1), key[-26:], fill=(230, 230, 230))
        draw.text((x + 3, y + tile + 14), shown.caption[:26], fill=(120, 200, 255))
    sheet.save(out_png)
    return picks


@dataclass
class VerifyResult:
    """What ``verify_dataset`` found."""

    path: str
    count: int = 0
    checked: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how it was checked (a URL: the server's bytes)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_dataset(path: str | os.PathLike, *, decode_images: bool = True) -> VerifyResult:
    """Check structure against the manifest, every checksum, and (by default) decode every image."""
    scratch = None
    try:
        reader = open_reader(path)
        if is_url(path) and not hasattr(reader, "verify_note"):
            # LMDB / HDF5 at a URL: the node cache's copy says nothing about the server's bytes, so
            # everything is downloaded again into a scratch cache (each file checked against the
            # uploaded sha256 list as it lands), verified, then dropped
            scratch = tempfile.mkdtemp(prefix="packer-verify-")
            reader = open_reader(path, remote=RemoteOptions(cache_dir=scratch))
    except PackerError as e:
        _drop(scratch)
        return VerifyResult(str(path), problems=[str(e)])
    try:
        return _verify(path, reader, decode_images,
                       "server: every file downloaded again into a scratch cache and checked against the "
                       "uploaded sha256 list" if scratch else None)
    finally:
        if hasattr(reader, "close"):
            reader.close()
        _drop(scratch)


def _drop(folder: str | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _verify(path: str | os.PathLike, reader: Any, decode_images: bool, note: str | None) -> VerifyResult:
    result = VerifyResult(str(path), count=len(reader))
    if note:
        result.notes.append(note)
    seen: set[str] = set()

    def report(problem: Exception) -> None:
        text = str(problem)
        if text not in seen:
            seen.add(text)
            result.problems.append(text)

    def decodes(i: int, rec: Record) -> None:
        if decode_images and rec.fmt in (VIDEO_FMT, MP4_FMT):  # pack-videos: its stream decodes whole
            try:
                blob = pack_stream(rec.data, index_mp4(rec.data)) if rec.fmt == MP4_FMT else rec.data
                n, indexed = count_frames(blob), unpack_stream(blob)[1].frames
                if n != indexed:
                    raise ValueError(f"decodes to {n} frames, its index holds {indexed}")
            except Exception as e:  # av.error.FFmpegError too
                raise CorruptData(str(path), f"undecodable video ({e})", position=f"sample {i}") from None
        elif rec.fmt == BLOB_FMT:  # a field pack: every field decodes, each image field too
            try:
                parts = reader.schema.split(rec.data)
            except ValueError as e:
                raise CorruptData(str(path), f"malformed field blob ({e})", position=f"sample {i}",
                                  key=reader._key_name(i)) from e
            for f in reader.schema.fields:
                try:
                    value = f.decode(parts[f.name])
                    if decode_images and f.type_name == "image":
                        try:
                            decode(value)
                        except ValueError as e:
                            raise ValueError(f"field {f.name!r}: undecodable image ({e})") from e
                except ValueError as e:
                    raise CorruptData(str(path), f"malformed field ({e})", position=f"sample {i}",
                                      key=reader._key_name(i)) from e
        elif decode_images and rec.fmt != "raw":
            try:
                decode(rec.data)
            except ValueError as e:
                raise CorruptData(str(path), f"undecodable image ({e})", position=f"sample {i}") from e

    for problem in reader.verify(check_record=decodes):  # one pass: read (CRC-checked), decode
        report(problem)
    result.checked = len(reader)
    if getattr(reader, "verify_note", None):
        result.notes.append(reader.verify_note)
    if reader.manifest.version > 1:
        _verify_versions(path, reader, decodes, report, result)
    return result


def _verify_versions(path: str | os.PathLike, latest: Any, decodes: Any, report: Any, result: VerifyResult) -> None:
    """Every earlier version of an appended output: its manifest, keys and structure, and the
    samples it holds that the latest version left out (the others were read just now)."""
    n = latest.manifest.version
    if is_url(path):
        result.notes.append(f"{n} versions: the latest checked (earlier versions are checked locally)")
        return
    held = set(latest.positions().tolist())
    extra = 0
    for v in range(1, n):
        try:
            older = open_reader(path, version=v)
        except PackerError as e:
            report(e)
            continue
        try:
            only = [i for i, p in enumerate(older.positions().tolist()) if p not in held]
            for problem in older.verify(check_record=decodes, indices=only):
                report(problem)
            held.update(older.positions().tolist())
            extra += len(only)
        finally:
            older.close()
    result.checked += extra
    result.notes.append(f"{n} versions: every version's manifest, keys and structure checked; each stored "
                        f"sample read once ({extra} only in earlier versions)")
