"""Map-style datasets over any packed output."""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image

from packer.data import batch_memory
from packer.data.fields import FieldDecoder, field_collate
from packer.errors import CorruptData, UsageError
from packer.formats import Reader, Record
from packer.remote import open_reader
from packer.codecs.image import decode, to_chw

__all__ = ["PackedDataset", "DECODE_MODES", "decode_record", "raw_record", "require_holds"]

DECODE_MODES = ("pil", "numpy", "tensor", "bytes")
# the dataset class for what a pack holds (``Manifest.holds``)
READ_WITH = {"images": "PackedDataset (or StreamingDataset)", "frames": "PackedVideoDataset",
             "videos": "PackedVideoDataset"}


def require_holds(manifest: Any, path: Any, cls: str, accepts: Sequence[str]) -> None:
    """``UsageError`` naming the class to use unless ``manifest`` (of the pack at ``path``) holds
    one of ``accepts`` (``Manifest.holds``): a pack of another kind read by ``cls`` would fail
    sample by sample, and with ``on_corrupt="skip"`` be skipped sample by sample."""
    holds = manifest.holds
    if holds not in accepts:
        what = {"images": "an image pack", "frames": "a decode-frames output (video frames)",
                "videos": "a pack-videos output (encoded videos)"}[holds]
        raise UsageError(f"{path}: {cls} cannot read {what}; use {READ_WITH[holds]}")


def decode_record(data: bytes, mode: str, *, where: str = "") -> Any:
    """Encoded bytes -> PIL image, HxWx3 uint8 array, 3xHxW uint8 tensor, or the bytes."""
    if mode == "bytes":
        return data
    try:
        arr = decode(data)
    except ValueError as e:
        raise CorruptData(where, str(e)) from e
    if mode == "numpy":
        return arr
    if mode == "tensor":
        return torch.from_numpy(to_chw(arr))
    return Image.fromarray(arr)


def raw_record(rec: Record, mode: str, *, where: str = "") -> Any:
    """Raw HxWxC uint8 pixels -> what ``decode_record`` gives for encoded bytes (3-channel RGB;
    grey is repeated, a fourth channel dropped; arrays are writable)."""
    if mode == "bytes":
        return rec.data
    n = rec.height * rec.width * rec.channels
    if rec.channels not in (1, 3, 4) or len(rec.data) != n:
        raise CorruptData(where, f"{len(rec.data)} raw bytes do not make {rec.height}x{rec.width}x{rec.channels}")
    view = np.frombuffer(rec.data, dtype=np.uint8).reshape(rec.height, rec.width, rec.channels)
    if rec.channels == 1:
        view = np.broadcast_to(view, (rec.height, rec.width, 3))
    elif rec.channels == 4:
        view = view[:, :, :3]
    if mode == "tensor":  # one copy, straight into CHW
        return torch.from_numpy(to_chw(view))
    arr = np.array(view)  # one copy, writable
    return arr if mode == "numpy" else Image.fromarray(arr)


class PackedDataset(torch.utils.data.Dataset):
    """Random access to any packed output of images (format read from its manifest), or to a
    ``decode-frames`` output's frames one by one; a ``pack-videos`` output is refused with a
    ``UsageError`` naming ``PackedVideoDataset``.

    Returns ``(image, label)``; a field pack (``packer.pack(..., coco=...)`` / ``manifest=``) a dict
    of its fields instead (docs/fields.md; ``collate_fn()`` batches them). Images are decoded with
    EXIF orientation applied and as 3-channel uint8 RGB (see ``packer.codecs.image``). Safe with
    DataLoader workers under ``fork`` and ``spawn``: storage opens lazily in each process, never
    pickled open.

    Args:
        path: the packed output.
        decode: ``"pil"`` | ``"numpy"`` (HxWx3 uint8) | ``"tensor"`` (3xHxW uint8) | ``"bytes"``,
            or a callable taking the encoded bytes (an HxWxC uint8 array for raw samples) and
            returning the image, e.g. ``packer.data.decode.DecodeResizeCrop(256, 224)``.
        transform: applied to the decoded image.
        target_transform: applied to the label.
        check_crc: verify each sample's CRC32C on read.
        cache_dir, cache_limit: for a URL ``path`` (``s3://``, ``https://``, ...): the node
            cache folder and its size limit (bytes or ``"50GB"``); see docs/remote.md.
        remote: the other URL options (``packer.remote.RemoteOptions``: storage options,
            prefetch, access, retries); ``cache_dir``/``cache_limit`` given here win.
        fields: a field pack's fields to return, in that order (a name or a list; default all);
            only these are decoded.
        masks: a field pack's masks as COCO RLE dicts (``"rle"``, the default: polygons drawn),
            ``(N, H, W)`` uint8 arrays (``"decode"``, pycocotools) or as stored
            (``"segmentation"``: COCO's polygons kept, ``packer.codecs.fields.Segmentation``).
        tv_tensors: a field pack's samples as torchvision ``tv_tensors`` (``Image``,
            ``BoundingBoxes`` XYXY with the stored image's ``canvas_size``, ``Mask``; other
            arrays as tensors) so that ``torchvision.transforms.v2`` (as ``transform``) moves
            boxes and masks with the pixels; needs torchvision. See
            ``packer.data.fields.FieldDecoder``.
        version: of an output that was appended to, the version to read (None: the latest;
            docs/append.md). A dataset reads its version's samples whatever is appended later.
    """

    def __init__(self, path: str | os.PathLike, *, decode: str | Callable[[Any], Any] = "pil",
                 transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None, check_crc: bool = True,
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | str | None = None,
                 remote: Any = None, fields: Sequence[str] | str | None = None, masks: str | None = None,
                 tv_tensors: bool = False, version: int | None = None):
        if not callable(decode) and decode not in DECODE_MODES:
            raise UsageError(f"decode must be one of {DECODE_MODES}, not {decode!r}")
        if cache_dir is not None or cache_limit is not None or remote is not None:
            from packer.remote import RemoteOptions
            from dataclasses import replace

            remote = remote or RemoteOptions()
            remote = replace(remote, cache_dir=cache_dir if cache_dir is not None else remote.cache_dir,
                             cache_limit=cache_limit if cache_limit is not None else remote.cache_limit)
        self.reader: Reader = open_reader(path, check_crc=check_crc, remote=remote, version=version)
        self.path = str(path)
        require_holds(self.reader.manifest, self.path, "PackedDataset", ("images", "frames"))
        self.decode = decode
        self.transform = transform
        self.target_transform = target_transform
        self.fields: FieldDecoder | None = None
        schema = self.reader.schema
        if schema is not None:  # a field pack: a dict per sample (docs/fields.md)
            if target_transform is not None:
                raise UsageError("a field pack's samples are dicts: use transform, not target_transform")
            if tv_tensors and decode == "bytes":
                raise UsageError("tv_tensors=True decodes images into tv_tensors.Image: decode='bytes' keeps them encoded")
            self.fields = FieldDecoder(schema, image=self._image_field, fields=fields, masks=masks,
                                       tv_tensors=tv_tensors)
        elif fields is not None or masks is not None or tv_tensors:
            raise UsageError(f"{path}: fields=, masks= and tv_tensors= apply to field packs "
                             "(this one holds images and labels)")

    def __len__(self) -> int:
        return len(self.reader)

    @property
    def classes(self) -> list[str]:
        """Class names, index = label."""
        return self.reader.classes

    @property
    def categories(self) -> list[dict[str, Any]]:
        """A COCO pack's categories by label (``classes`` are their names): ``{id, name}``, with
        ``keypoints`` (the names of the points of ``keypoints[:, k]``) and ``skeleton`` (pairs of
        1-based point numbers, as COCO writes them) where the annotation file names keypoints.
        Empty for other packs."""
        coco = self.reader.manifest.extra.get("coco")
        return [dict(c) for c in coco.get("categories") or []] if isinstance(coco, dict) else []

    @property
    def keys(self) -> list[str]:
        """Sample keys (source paths relative to the input root) by position."""
        return self.reader.keys

    @property
    def manifest(self):
        """The dataset's manifest."""
        return self.reader.manifest

    @property
    def schema(self) -> Any:
        """A field pack's ``Schema`` (``packer.codecs.fields``); None for a pack of images and labels."""
        return self.reader.schema

    @property
    def variable_fields(self) -> list[str]:
        """The returned fields whose length varies by sample (boxes, labels, masks): what
        ``collate_fn`` lists or pads in every batch. Empty for image packs."""
        return list(self.fields.variable) if self.fields is not None else []

    def collate_fn(self, *, pad: bool = False) -> Callable[[Sequence[dict[str, Any]]], dict[str, Any]]:
        """A field pack's collate for ``DataLoader(collate_fn=...)``: ``collate_fields`` with this
        dataset's ``variable_fields`` (lists, or with ``pad`` zero-padded tensors and
        ``<name>_count``, in every batch); fixed fields stacked."""
        if self.fields is None:
            raise UsageError(f"{self.path}: collate_fn is for field packs; batch (image, label) with "
                             "packer.data.uint8_collate or the DataLoader's default")
        return field_collate(self.fields.variable, pad=pad)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        batch_memory.use_in_worker()
        return self._sample(index, self.reader.read(index))

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, Any]]:
        """Several samples with one batched read where the format has one (the DataLoader calls
        this with a batch's indices)."""
        batch_memory.use_in_worker()
        return list(self.iter_items(indices))

    def iter_items(self, indices: Sequence[int]) -> Iterator[tuple[Any, Any]]:
        """``__getitems__`` lazily: each sample is decoded right after its read (while its bytes
        are in the CPU cache) and can be consumed before the next is read (``packer.Loader``)."""
        records = self.reader.read_many(indices)
        for i in indices:
            # not zip(): the result tuple it reuses keeps each record's bytes alive through the
            # next read (a 150 KB raw sample: ~8 µs of ~45 more a sample, batched)
            yield self._sample(i, next(records))

    def _image_field(self, data: bytes | memoryview) -> Any:
        """An image field's value, decoded as ``decode`` says (ValueError when undecodable)."""
        if callable(self.decode):
            return self.decode(data)
        if self.decode == "bytes":
            return bytes(data)
        try:
            return decode_record(data, self.decode)
        except CorruptData as e:
            raise ValueError(e.reason) from e

    def _sample(self, index: int, rec: Record) -> tuple[Any, Any]:
        if self.fields is not None:
            try:
                sample = self.fields(rec.data)
            except ValueError as e:
                raise CorruptData(self.path, f"malformed field ({e})", position=f"sample {index}",
                                  key=self._key(index)) from e
            return self.transform(sample) if self.transform is not None else sample
        if callable(self.decode):
            image = self._decode_with(self.decode, rec, index)
        else:
            try:
                image = raw_record(rec, self.decode) if rec.fmt == "raw" else decode_record(rec.data, self.decode)
            except CorruptData as e:  # named here, not for every sample (a raw read is ~50 µs in all)
                raise CorruptData(f"{self.path} sample {index}", e.reason) from e
        label = rec.label
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def _key(self, index: int) -> str | None:
        """Sample ``index``'s key for an error message (None when it cannot be had)."""
        try:
            return self.reader.keys[index]
        except Exception:  # noqa: BLE001 - only a hint in a message about damage
            return None

    def _decode_with(self, fn: Callable[[Any], Any], rec: Record, index: int) -> Any:
        try:
            data = raw_record(rec, "numpy") if rec.fmt == "raw" else rec.data
        except CorruptData as e:
            raise CorruptData(f"{self.path} sample {index}", e.reason) from e
        try:
            return fn(data)
        except ValueError as e:
            raise CorruptData(f"{self.path} sample {index}", str(e)) from e
