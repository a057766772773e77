"""Optical flow frames for ``decode-frames --task flow|both``: the options, the per-frame
step run inside ``read_video`` (flow from the previous selected frame, grey, at the output
size), and the x/y images of a decoded video."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from packer.codecs.flow import (DEFAULT_BOUND, DEFAULT_FLOW_TEMPLATE, FlowEstimator, check_flow_template,
                                encode_grey, grey, quantize, zero_flow)
from packer.conversion.video_inputs import VideoItem
from packer.errors import CorruptSample, UsageError

__all__ = ["TASKS", "FlowOptions", "FlowProcess", "flow_images"]

TASKS = ("rgb", "flow", "both")


@dataclass(frozen=True)
class FlowOptions:
    """``--task flow|both``: optical flow by method ``flow`` between consecutive selected
    frames (grey, at the output size), quantized with ``bound`` into grey ``x``/``y`` images
    named by ``flow_tmpl`` (``{}_{:05d}.EXT``: direction, then frame number), as mmaction2's
    flow tools. ``task="rgb"`` (the default): no flow."""

    task: str = "rgb"
    flow: str = "tvl1"
    bound: float = DEFAULT_BOUND
    flow_tmpl: Optional[str] = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise UsageError(f"--task must be one of {', '.join(TASKS)}, not {self.task!r}")
        if self.task == "rgb":
            return
        if not self.bound > 0:
            raise UsageError(f"--bound must be > 0, not {self.bound}")
        FlowEstimator(self.flow)  # validates the method (and TV-L1's OpenCV build)
        if self.flow_tmpl is not None:
            check_flow_template(self.flow_tmpl)

    def resolved(self, ext: str) -> Optional["FlowOptions"]:
        """These options with the template filled in for frames of ``ext``; None without flow."""
        if self.task == "rgb":
            return None
        return FlowOptions(self.task, self.flow, self.bound,
                           self.flow_tmpl or DEFAULT_FLOW_TEMPLATE.replace(".jpg", f".{ext}"))

    @property
    def fmt(self) -> str:
        return check_flow_template(self.flow_tmpl or DEFAULT_FLOW_TEMPLATE)


class FlowProcess:
    """The per-frame step of a flow job (``read_video``'s ``process``): encode the RGB frame
    with ``encode`` (``--task both``) and the flow from the previous frame to this one."""

    def __init__(self, opts: FlowOptions, encode: Optional[Callable[[np.ndarray], bytes]], quality: int):
        self.opts, self.encode, self.quality = opts, encode, quality
        self.estimate = FlowEstimator(opts.flow)
        self.prev = None

    def __call__(self, frame) -> tuple[Optional[bytes], Optional[tuple[bytes, bytes]]]:
        g = grey(frame)
        pair = None
        if self.prev is not None:
            opts, q = self.opts, self.quality
            flow = self.estimate(self.prev, g)
            pair = (encode_grey(quantize(flow[:, :, 0], opts.bound), opts.fmt, q),
                    encode_grey(quantize(flow[:, :, 1], opts.bound), opts.fmt, q))
        self.prev = g
        return (self.encode(frame) if self.encode is not None else None), pair


def flow_images(item: VideoItem, values: list, height: int, width: int, opts: FlowOptions,
                quality: int) -> list[bytes]:
    """Encoded x, y images (in turn) of the flow between each pair of consecutive selected
    frames; ``values`` are what ``FlowProcess`` returned per frame, a repeated frame repeated."""
    if len(values) < 2:
        raise CorruptSample(item.key, item.path, f"{len(values)} frame(s) selected: no pair of "
                            "consecutive frames to compute flow between", stage="flow")
    out: list[bytes] = []
    still = None
    for k in range(1, len(values)):
        if values[k] is values[k - 1]:  # one source frame repeated (--fps above the source's)
            if still is None:
                z = encode_grey(zero_flow(height, width, opts.bound), opts.fmt, quality)
                still = (z, z)
            out.extend(still)
        else:
            out.extend(values[k][1])
    return out
