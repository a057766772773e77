"""packer: pre-decode, pre-resize and pack datasets offline; stream them back fast.

The public API is ``packer.__all__`` (and ``packer.data.__all__``); docs/api.md lists it.
Every other module is internal: its names may change between versions.

Conversion, one function per command (``packer.api``): ``pack``, ``decode_frames``, ``pack_videos``,
``resize``, ``merge``, ``export``, ``verify``, ``inspect``, ``index``, ``bench``, ``demo``.
Training: ``PackedDataset``, ``StreamingDataset``, ``FrameDataset``, ``PackedVideoDataset``,
``Loader``, ``DevicePrefetcher`` (more in ``packer.data``).
"""
from __future__ import annotations

from typing import Any

from packer._version import __version__
from packer.errors import OutputChanged, PackerError, TooManyFailures, UsageError, VerifyFailed

__all__ = ["__version__",
           # conversion (packer.api)
           "pack", "decode_frames", "pack_videos", "resize", "merge", "export", "verify", "inspect", "index",
           "bench", "demo",
           "ResizeSpec",
           # training (packer.data)
           "PackedDataset", "StreamingDataset", "FrameDataset", "PackedVideoDataset", "Loader",
           "DevicePrefetcher",
           # errors
           "PackerError", "UsageError", "TooManyFailures", "VerifyFailed", "OutputChanged"]

# Names served on first use (PEP 562): ``import packer`` stays cheap (no torch, no numpy) until
# a name that needs them is touched, so the CLI starts fast.
_LAZY = {
    **{name: "packer.api" for name in ("pack", "decode_frames", "pack_videos", "resize", "merge", "export",
                                       "verify", "inspect", "index", "bench", "demo")},
    "ResizeSpec": "packer.codecs.resize",
    "PackedDataset": "packer.data.datasets",
    "StreamingDataset": "packer.data.streaming",
    "FrameDataset": "packer.data.video",
    "PackedVideoDataset": "packer.data.video",
    "Loader": "packer.data.loader",
    "DevicePrefetcher": "packer.data.device",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'packer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
