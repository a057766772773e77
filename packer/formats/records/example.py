"""records format: a Sample as ImageNet-style ``tf.train.Example`` features, and back."""
from __future__ import annotations

from typing import Any

from packer.codecs.image import sniff_format
from packer.codecs.tfexample import (bytes_entry_head, example_head, example_pieces, feature_entry,
                                     int64_feature)
from packer.formats.sample import Record, Sample

__all__ = ["sample_features", "sample_pieces", "record_of"]


def sample_features(sample: Sample) -> dict[str, Any]:
    """The ImageNet-style features of one sample; video frames add ``video/index`` (from
    ``extra["video_index"]``) and ``frame/index`` (``extra["frame_index"]`` or ``["frame"]``)."""
    feats: dict[str, Any] = {
        "image/encoded": sample.data,
        "image/format": sample.fmt.encode("ascii"),
        "image/class/label": int(sample.label),
        "image/height": int(sample.height),
        "image/width": int(sample.width),
        "image/channels": int(sample.channels),
        "image/filename": sample.key.encode("utf-8"),
    }
    if not sample.extra:  # an image: nothing more (the per-sample hot path)
        return feats
    for extras, name in ((("video_index",), "video/index"), (("frame_index", "frame"), "frame/index")):
        value = next((sample.extra[e] for e in extras if e in sample.extra), None)
        if value is not None:
            feats[name] = int(value)
    return feats


def sample_pieces(sample: Sample) -> tuple[list, int]:
    """``example_pieces(sample_features(sample))``: the Example's bytes as pieces, the image
    bytes not copied, and their length. An image (no ``extra``: the per-sample hot path of
    ``to-records``) is laid out directly in ~2 µs instead of the generic encoder's ~5: its
    features in name order, with the same entries (tested byte for byte against the generic
    encoder)."""
    if sample.extra:
        return example_pieces(sample_features(sample))
    data = sample.data
    before = (feature_entry("image/channels", int(sample.channels))
              + feature_entry("image/class/label", int(sample.label))
              + bytes_entry_head("image/encoded", len(data)))
    after = (feature_entry("image/filename", sample.key.encode("utf-8"))
             + feature_entry("image/format", sample.fmt.encode("ascii"))
             + feature_entry("image/height", int(sample.height))
             + feature_entry("image/width", int(sample.width)))
    length = len(before) + len(data) + len(after)
    head = example_head(length)
    return [head, before, data, after], len(head) + length


_FMT_ALIASES = {"jpg": "jpeg", "tif": "tiff"}


def record_of(feats: dict[str, list]) -> Record:
    """The Record of an Example's features; ValueError when ``image/encoded`` is missing."""
    data = feats.get("image/encoded")
    if not data or not isinstance(data[0], bytes):
        raise ValueError("no image/encoded bytes feature")
    fmt_value = feats.get("image/format")
    if fmt_value and isinstance(fmt_value[0], bytes) and fmt_value[0]:
        fmt = fmt_value[0].decode("ascii", "replace").lower()
        fmt = _FMT_ALIASES.get(fmt, fmt)
    else:
        fmt = sniff_format(data[0])
    return Record(data[0], int64_feature(feats, "image/class/label", -1), fmt,
                  int64_feature(feats, "image/height", 0), int64_feature(feats, "image/width", 0),
                  int64_feature(feats, "image/channels", 0))
