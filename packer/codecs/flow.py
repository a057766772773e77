"""Optical flow between consecutive frames, quantized to grey images as mmaction2 stores it.

mmaction2's flow tools (``tools/misc/flow_extraction.py``, denseflow behind
``build_rawframes.py --task flow``) write each flow field as two grey 8-bit images, ``x`` and
``y``: the flow, in pixels, clipped to ``[-bound, bound]`` and mapped linearly onto
``0..255`` (``(f + bound) * 255 / (2 * bound)``, truncated to an integer as
``flow_extraction.flow_to_img`` does, so zero motion is 127). ``quantize`` repeats that
arithmetic in float32, step for step, so the images are bit-identical to the tool's.

Methods (all on grey frames, in OpenCV):

* ``tvl1``: ``cv2.optflow.DualTVL1OpticalFlow`` with OpenCV's default parameters (what
  mmaction2 and denseflow use); needs OpenCV's contrib build (``opencv-contrib-python-headless``).
* ``farneback``: ``cv2.calcOpticalFlowFarneback`` with mmaction2's parameters
  (``0.5, 3, 15, 3, 5, 1.2, 0``).
* ``dis``: ``cv2.DISOpticalFlow`` (``PRESET_FAST``), the fast one: a few ms per 340x256 pair.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import cv2
import numpy as np

from packer.errors import UsageError

__all__ = ["FLOW_METHODS", "DEFAULT_BOUND", "DEFAULT_FLOW_TEMPLATE", "FlowEstimator", "quantize",
           "zero_flow", "tvl1_available", "check_flow_template"]

log = logging.getLogger(__name__)

FLOW_METHODS = ("tvl1", "farneback", "dis")
DEFAULT_BOUND = 20.0
DEFAULT_FLOW_TEMPLATE = "{}_{:05d}.jpg"
_FARNEBACK = (0.5, 3, 15, 3, 5, 1.2, 0)  # mmaction2 tools/misc/flow_extraction.py


def tvl1_available() -> bool:
    """True when this OpenCV has the contrib ``optflow`` module (TV-L1)."""
    return hasattr(cv2, "optflow") and hasattr(cv2.optflow, "DualTVL1OpticalFlow_create")


def quantize(flow: np.ndarray, bound: float = DEFAULT_BOUND) -> np.ndarray:
    """One flow component (float32 HxW, pixels) -> uint8, as mmaction2's ``flow_to_img``:
    clip to ``[-bound, bound]``, add ``bound``, scale by ``255 / (2 * bound)``, truncate."""
    f = np.clip(flow, -bound, bound)  # float32 in, float32 out (bound is a Python float)
    f += bound
    f *= 255 / float(2 * bound)
    return f.astype(np.uint8)


def zero_flow(height: int, width: int, bound: float = DEFAULT_BOUND) -> np.ndarray:
    """The quantized image of no motion (between two copies of one frame)."""
    return quantize(np.zeros((height, width), np.float32), bound)


def check_flow_template(tmpl: str) -> str:
    """Validate a flow file name template (``{}_{:05d}.jpg``: direction, then number); return
    its image format (``jpeg`` or ``png``)."""
    try:
        names = {tmpl.format(d, n) for d in ("x", "y") for n in (1, 2)}
    except (IndexError, KeyError, ValueError) as e:
        raise UsageError(f"--flow-tmpl {tmpl!r} needs a direction field then a number field, "
                         f"as '{{}}_{{:05d}}.jpg' ({e})") from e
    if len(names) != 4 or any("/" in n or "\\" in n or n.startswith(".") for n in names):
        raise UsageError(f"--flow-tmpl {tmpl!r} must put the direction and the number in a plain file name")
    ext = tmpl.format("x", 1).rsplit(".", 1)[-1].lower()
    fmt = {"jpg": "jpeg", "jpeg": "jpeg", "png": "png"}.get(ext)
    if fmt is None:
        raise UsageError(f"--flow-tmpl {tmpl!r} must end in .jpg or .png")
    return fmt


@dataclass(frozen=True)
class FlowEstimator:
    """Dense flow from one grey frame to the next (float32 HxWx2: x, y in pixels).

    Picklable (the OpenCV object is made lazily, on first use, in the process that uses it).
    One estimator per video: DIS keeps state between calls, so an object reused across videos
    would make a video's first flow frame depend on the video before it (and the output on
    how videos are spread over workers)."""

    method: str = "tvl1"

    def __post_init__(self) -> None:
        if self.method not in FLOW_METHODS:
            raise UsageError(f"--flow must be one of {', '.join(FLOW_METHODS)}, not {self.method!r}")
        if self.method == "tvl1" and not tvl1_available():
            raise UsageError("--flow tvl1 needs OpenCV's contrib build (cv2.optflow): "
                             "pip install opencv-contrib-python-headless (it replaces opencv-python-headless)")

    def __getstate__(self) -> dict:
        return {"method": self.method}  # not the OpenCV object

    def __setstate__(self, state: dict) -> None:
        object.__setattr__(self, "method", state["method"])

    def _op(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        op = self.__dict__.get("_calc")
        if op is None:
            if self.method == "tvl1":
                tvl1 = cv2.optflow.DualTVL1OpticalFlow_create()
                op = lambda a, b: tvl1.calc(a, b, None)  # noqa: E731
            elif self.method == "farneback":
                op = lambda a, b: cv2.calcOpticalFlowFarneback(a, b, None, *_FARNEBACK)  # noqa: E731
            else:
                dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_FAST)
                op = lambda a, b: dis.calc(a, b, None)  # noqa: E731
            object.__setattr__(self, "_calc", op)
        return op

    def __call__(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """Flow from grey ``prev`` to grey ``nxt`` (uint8 HxW, same size)."""
        if prev.shape != nxt.shape or prev.ndim != 2:
            raise ValueError(f"flow needs two grey frames of one size, got {prev.shape} and {nxt.shape}")
        return self._op()(prev, nxt)

    def quantized(self, prev: np.ndarray, nxt: np.ndarray,
                  bound: float = DEFAULT_BOUND) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) uint8 images of the flow from ``prev`` to ``nxt``."""
        flow = self(prev, nxt)
        return quantize(flow[:, :, 0], bound), quantize(flow[:, :, 1], bound)


def grey(frame_bgr: np.ndarray) -> np.ndarray:
    """A BGR frame as the grey image flow is computed on (``cv2.COLOR_BGR2GRAY``, as mmaction2)."""
    return cv2.cvtColor(frame_bgr, cv2.COLOR_BGR2GRAY)


def encode_grey(image: np.ndarray, fmt: str = "jpeg", quality: int = 95) -> bytes:
    """One grey uint8 image -> JPEG (``quality``) or PNG bytes."""
    if fmt == "jpeg":
        ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    else:
        ok, buf = cv2.imencode(".png", image, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise ValueError(f"cannot encode a {image.shape} flow image as {fmt}")
    return buf.tobytes()


def decode_grey(data: bytes) -> Optional[np.ndarray]:
    """Encoded grey image -> uint8 HxW (``cv2.IMREAD_GRAYSCALE``, as mmcv's ``flag='grayscale'``)."""
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_GRAYSCALE)
    if img is None:
        raise ValueError("not a decodable image")
    return img


__all__ += ["grey", "encode_grey", "decode_grey"]
