"""``--fps`` selects frames the same way everywhere (issue 40, item 5).

``pack-videos --fps F`` failed every video where F repeats a source frame (a 30 fps source at
``--fps 60``: "60 frames encoded for the 120 decoded"; a variable-frame-rate source at ``--fps
12``: 27 for 29): the encoder got one frame where the selection took several. The invariant:
for a constant or variable frame rate, up- or down-sampling, with ``--max-frames`` or
``--stride``, ``pack-videos`` (through the CLI, decoding the stored stream) and ``decode-frames``
store the same frame list (each frame's source frame, read back from the numbers the source
frames draw in their pixels), that list is the one ``FrameSelection.select`` gives for the
source's own timestamps, and the manifest records it (``source_frames``).
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

av = pytest.importorskip("av")

from packer.codecs.frame_selection import FrameSelection  # noqa: E402
from packer.codecs.video_pack import decode_all  # noqa: E402
from packer.formats import open_reader  # noqa: E402
from tests.support.edge_videos import write_numbered  # noqa: E402
from tests.support.killing import run_packer  # noqa: E402
from tests.support.numbered_video import read_number  # noqa: E402

FRAMES = 30

# (source, options): up- and down-sampling a 30 fps source and a variable-frame-rate one (frames
# of 17 to 100 ms), cut by --max-frames mid-repeat, decoded by decord, and --stride.
CASES = {
    "cfr30-up-60": ("cfr", ["--fps", "60"]),
    "cfr30-down-12": ("cfr", ["--fps", "12"]),
    "vfr-down-12": ("vfr", ["--fps", "12"]),
    "vfr-up-60": ("vfr", ["--fps", "60"]),
    "cfr30-up-60-max-7": ("cfr", ["--fps", "60", "--max-frames", "7"]),
    "vfr-up-60-decord": ("vfr", ["--fps", "60", "--backend", "decord"]),
    "cfr30-stride-4-max-5": ("cfr", ["--stride", "4", "--max-frames", "5"]),
}


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, Path]:
    """One class folder of one numbered video each: 30 frames at 30 fps, and 30 at a variable rate."""
    root = tmp_path_factory.mktemp("fps-sources")
    write_numbered(root / "cfr" / "c" / "cfr30.mp4", FRAMES, fps=30)
    write_numbered(root / "vfr" / "c" / "vfr.mp4", FRAMES, vfr=True)
    return {"cfr": root / "cfr", "vfr": root / "vfr"}


def source_times(video: Path) -> list[float]:
    """The video's presentation times in seconds from its first frame, in display order (PyAV)."""
    with av.open(str(video)) as c:
        s = c.streams.video[0]
        pts = sorted(int(p.pts) for p in c.demux(s) if p.size and p.pts is not None)
        return [float((p - pts[0]) * s.time_base) for p in pts]


def packed_numbers(out: Path) -> tuple[list[int], dict]:
    """The numbers the frames of a one-video ``pack-videos`` output show (a sequential decode of the
    stored stream), and its manifest entry."""
    reader = open_reader(out)
    assert len(reader) == 1
    frames = decode_all(reader.read(0).data)  # RGB
    return [read_number(f) for f in frames], reader.manifest.videos[0]


def frame_numbers(out: Path) -> tuple[list[int], dict]:
    """The numbers the frames of a one-video ``decode-frames --to records`` output show, in frame
    order, and its manifest entry."""
    reader = open_reader(out)
    order = sorted(range(len(reader)), key=lambda i: int(reader.keys[i].rsplit("/", 1)[1]))
    numbers = [read_number(cv2.imdecode(np.frombuffer(reader.read(i).data, np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1])
               for i in order]
    return numbers, reader.manifest.videos[0]


def selection_of(options: list[str]) -> FrameSelection:
    """The ``FrameSelection`` the command-line ``options`` ask for."""
    opts = dict(zip(options[::2], options[1::2]))
    return FrameSelection(fps=float(opts["--fps"]) if "--fps" in opts else None,
                          stride=int(opts["--stride"]) if "--stride" in opts else None,
                          max_frames=int(opts["--max-frames"]) if "--max-frames" in opts else None)


@pytest.mark.parametrize("case", sorted(CASES))
def test_pack_videos_stores_the_frames_decode_frames_does(case, trees, tmp_path):
    source, options = CASES[case]
    src = trees[source]
    packed, frames = tmp_path / "packed.rec", tmp_path / "frames.rec"
    r = run_packer("pack-videos", src, packed, "--to", "records", "--workers", 0, *options)
    assert r.returncode == 0, r.stderr
    assert not (packed / "failures.jsonl").exists() or not (packed / "failures.jsonl").read_text().strip()
    r = run_packer("decode-frames", src, frames, "--to", "records", "--workers", 0, *options)
    assert r.returncode == 0, r.stderr

    stored, pack_entry = packed_numbers(packed)
    decoded, frame_entry = frame_numbers(frames)
    video = next(src.rglob("*.mp4"))
    expected = selection_of(options).select(source_times(video), pack_entry["source_fps"])

    assert stored == decoded == expected, f"pack-videos {stored}\ndecode-frames {decoded}\nexpected {expected}"
    assert pack_entry["video_frames"] == pack_entry["frames"] == len(expected)
    # the manifest says which source frame each stored frame is (frame i of the source draws i)
    assert pack_entry["source_frames"] == frame_entry["source_frames"] == expected
