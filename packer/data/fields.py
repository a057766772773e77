"""Field packs on the training side: a sample's fields as a dict, and a collate for them.

``FieldDecoder`` turns a stored field blob into ``{name: value}``: only the selected fields
are decoded (the blob is split into views without a copy; nothing else is touched), image
fields as ``PackedDataset``'s ``decode`` says, ``rle`` masks as COCO RLE dicts or decoded
``(N, H, W)`` uint8 arrays (``masks="decode"``, pycocotools). ``collate_fields`` batches a list of
such dicts: fields of one shape in every sample are stacked into a tensor, variable-length ones
(boxes, masks, captions) stay lists.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from packer.codecs.fields import Schema
from packer.errors import CorruptData, UsageError

__all__ = ["FieldDecoder", "collate_fields", "MASK_MODES", "decode_masks"]

MASK_MODES = ("rle", "decode")


def decode_masks(rles: list[dict[str, Any]], height: int, width: int) -> np.ndarray:
    """COCO RLE dicts -> ``(N, H, W)`` uint8 (``(0, H, W)`` for none), with pycocotools.

    pycocotools decodes into an ``(H, W, N)`` Fortran-order array: each mask is a ``(W, H)``
    C-order block, transposed into place here by OpenCV (8x faster than numpy's strided copy:
    1.1 ms against 0.14 ms for six 480x640 masks)."""
    if not rles:
        return np.zeros((0, height, width), dtype=np.uint8)
    try:
        from pycocotools import mask as mask_util
    except ImportError as e:
        raise UsageError("masks='decode' needs pycocotools: pip install 'packer[coco]'") from e
    import cv2

    decoded = mask_util.decode(rles)
    h, w, n = decoded.shape
    out = np.empty((n, h, w), dtype=np.uint8)
    for k in range(n):
        cv2.transpose(np.ascontiguousarray(decoded[:, :, k].T), out[k])
    return out


class FieldDecoder:
    """Decode the selected fields of a field blob.

    Args:
        schema: the pack's schema.
        image: ``(data) -> image`` for each image field (``PackedDataset``'s decode).
        fields: the names to return (None: every field), in that order.
        masks: ``"rle"`` (COCO RLE dicts) or ``"decode"`` (``(N, H, W)`` uint8 arrays).
    """

    def __init__(self, schema: Schema, *, image: Callable[[bytes], Any], fields: Sequence[str] | None = None,
                 masks: str = "rle"):
        if masks not in MASK_MODES:
            raise UsageError(f"masks must be one of {MASK_MODES}, not {masks!r}")
        names = list(schema.names if fields is None else ([fields] if isinstance(fields, str) else fields))
        unknown = [n for n in names if n not in schema.by_name]
        if unknown:
            raise UsageError(f"no field {', '.join(map(repr, unknown))} in this pack (fields: {', '.join(schema.names)})")
        self.schema = schema
        self.names = names
        self.image = image
        self.masks = masks

    def __call__(self, blob: bytes | memoryview, *, where: str) -> dict[str, Any]:
        """``{name: value}`` of the selected fields; CorruptData naming ``where`` when malformed."""
        try:
            parts = self.schema.split(blob)
            out: dict[str, Any] = {}
            for name in self.names:
                f = self.schema.by_name[name]
                if f.type_name == "image":
                    out[name] = self.image(parts[name])
                elif f.type_name == "rle" and self.masks == "decode":
                    rles = f.decode(parts[name])
                    h, w = (rles[0]["size"] if rles else self._canvas(parts))
                    out[name] = decode_masks(rles, h, w)
                else:
                    out[name] = f.decode(parts[name])
            return out
        except ValueError as e:
            raise CorruptData(where, f"malformed field ({e})") from e

    def _canvas(self, parts: dict[str, memoryview]) -> tuple[int, int]:
        """(height, width) of the first image (for an empty mask stack)."""
        from packer.codecs.image import probe

        images = self.schema.image_fields
        if not images:
            return 0, 0
        info = probe(bytes(parts[images[0]]), check="header")
        return info.height, info.width


def _stackable(values: list[Any]) -> bool:
    first = values[0]
    if isinstance(first, (bool, int, float, np.integer, np.floating)):
        return all(isinstance(v, (bool, int, float, np.integer, np.floating)) for v in values)
    if isinstance(first, (np.ndarray, torch.Tensor)):
        return all(isinstance(v, type(first)) and v.shape == first.shape and v.dtype == first.dtype for v in values)
    return False


def collate_fields(batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Batch field dicts: each field whose values have one shape and dtype in every sample (an
    int, a float, a fixed-size array or tensor, same-size images as tensors) becomes one stacked
    tensor; every other field (variable-length boxes, masks, strings, PIL images) a list."""
    if not batch:
        return {}
    out: dict[str, Any] = {}
    for name in batch[0]:
        values = [sample[name] for sample in batch]
        if _stackable(values):
            first = values[0]
            if isinstance(first, torch.Tensor):
                out[name] = torch.stack(values)
            elif isinstance(first, np.ndarray):
                out[name] = torch.from_numpy(np.stack(values))
            else:
                out[name] = torch.as_tensor(values)
        else:
            out[name] = values
    return out
