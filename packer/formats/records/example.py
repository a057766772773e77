"""records format: a Sample as ImageNet-style ``tf.train.Example`` features, and back."""
from __future__ import annotations

from typing import Any

from packer.codecs.image import sniff_format
from packer.codecs.tfexample import int64_feature
from packer.formats.sample import Record, Sample

__all__ = ["sample_features", "record_of"]


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
