"""The video-pack tests' shared pieces: a synthetic video whose frames draw their own numbers,
the samplers every frame-exact test runs, and the check that clips equal a reference decode."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

from packer.data.samplers import DenseSampleFrames, SampleFrames, UntrimmedSampleFrames
from packer.data.video import ClipSampling, PackedVideoDataset

BITS, BLOCK = 9, 24  # frame numbers up to 511, one 24x24 black/white block per bit
SYNTH_FRAMES, SYNTH_H, SYNTH_W = 150, 256, 320

SAMPLERS = {
    "dense-test": ClipSampling(clip_len=32, frame_interval=2, num_clips=1, test_mode=True),
    "tsn-train": ClipSampling(clip_len=1, num_clips=8),
    "tsn-test": ClipSampling(clip_len=1, num_clips=8, test_mode=True, twice_sample=True),
    "slowfast-train-jitter": ClipSampling(clip_len=8, frame_interval=4, num_clips=2, temporal_jitter=True),
    "repeat-last": ClipSampling(clip_len=16, frame_interval=8, out_of_bound_opt="repeat_last"),
    "target-fps": SampleFrames(clip_len=8, frame_interval=2, target_fps=10.0),
    "dense-sample": DenseSampleFrames(clip_len=8, frame_interval=2, num_clips=2),
    "untrimmed": UntrimmedSampleFrames(clip_len=2, clip_interval=2),
}


def numbered(i: int) -> np.ndarray:
    """A BGR frame whose top row of blocks spells ``i`` in binary (white = 1), over a gradient."""
    img = np.zeros((SYNTH_H, SYNTH_W, 3), np.uint8)
    img[:, :, 1] = np.linspace(0, 120, SYNTH_W, dtype=np.uint8)[None, :]
    for b in range(BITS):
        img[:BLOCK, b * BLOCK:(b + 1) * BLOCK] = 255 if (i >> b) & 1 else 0
    return img


def write_numbered(path: Path, frames: int = SYNTH_FRAMES) -> Path:
    """An MP4 at ``path`` of ``frames`` ``numbered`` frames: H.264 with B-frames (three between
    references, a keyframe every 60), as a source video is coded; crf 12."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        s = out.add_stream("libx264", rate=Fraction(25))
        s.width, s.height, s.pix_fmt = SYNTH_W, SYNTH_H, "yuv420p"
        s.codec_context.options = {"crf": "12", "bf": "3", "g": "60"}
        for i in range(frames):
            for p in s.encode(av.VideoFrame.from_ndarray(numbered(i), format="bgr24")):
                out.mux(p)
        for p in s.encode(None):
            out.mux(p)
    return path


def read_number(rgb: np.ndarray) -> int:
    """The number ``numbered`` drew (from the block means: robust to lossy coding)."""
    return sum(1 << b for b in range(BITS)
               if rgb[4:BLOCK - 4, b * BLOCK + 4:(b + 1) * BLOCK - 4].mean() > 128)


def check_clips(ds: PackedVideoDataset, refs: list[list[np.ndarray]], *, numbers: bool) -> int:
    """Every clip of every video over three epochs equals the reference decode, frame by frame."""
    checked = 0
    for epoch in range(3):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            inds = ds.clip_indices(i)
            clip, _ = ds[i]
            assert clip.shape[0] == len(inds)
            for k, j in enumerate(inds.tolist()):
                frame = clip[k].permute(1, 2, 0).numpy()
                assert np.array_equal(frame, refs[i][j]), f"video {i} clip frame {k}: not frame {j}"
                if numbers:
                    assert read_number(frame) == j
                checked += 1
    return checked
