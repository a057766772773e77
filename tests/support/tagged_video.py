"""Videos whose colour tags (matrix, range) are those phones and HD cameras write, and none:
H.264 of saturated random 8x8 blocks, every chroma extreme in each frame."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

FRAMES, W, H = 24, 96, 64
# (pixel format, colour matrix, range): AVCOL_SPC_BT709 = 1; AVCOL_RANGE_MPEG = 1, JPEG = 2
TAGS = {"untagged": ("yuv420p", None, None), "bt709": ("yuv420p", 1, 1), "full-range": ("yuvj420p", None, 2),
        "bt709-full-range": ("yuvj420p", 1, 2)}


def write_tagged(path: Path, pix_fmt: str, matrix, colour_range) -> None:
    """H.264 of saturated random 8x8 blocks (chroma at every extreme), its colour tags set."""
    import av

    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        s = out.add_stream("libx264", rate=Fraction(25))
        s.width, s.height, s.pix_fmt = W, H, pix_fmt
        if matrix is not None:
            s.codec_context.colorspace = matrix
            s.codec_context.color_primaries = s.codec_context.color_trc = matrix
        if colour_range is not None:
            s.codec_context.color_range = colour_range
        s.codec_context.options = {"crf": "10", "bf": "2", "g": "6"}
        for _ in range(FRAMES):
            blocks = rng.integers(0, 2, (H // 8, W // 8, 3), dtype=np.uint8) * 255
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(blocks.repeat(8, 0).repeat(8, 1)), format="rgb24")
            if matrix is not None:
                frame.colorspace = matrix
            if colour_range is not None:
                frame.color_range = colour_range
            for p in s.encode(frame.reformat(format=pix_fmt, dst_colorspace=matrix, dst_color_range=colour_range)):
                out.mux(p)
        for p in s.encode(None):
            out.mux(p)
