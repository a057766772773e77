"""``pack-videos`` is byte-reproducible: the same source packed in two fresh processes, whose
heaps hold different bytes, stores the same streams.

Each run is a separate Python process started with a different ``MALLOC_PERTURB_`` (glibc fills
every allocation with a pattern: an encoder that reads memory it never wrote then encodes other
bytes) and a different amount of junk allocated before packing. x264's AVX-512 code did read such
memory (``packer.codecs.video_pack.x264_asm``): on an AVX-512 CPU the h264 case failed without
the fix, from the first frame on (on a CPU without AVX-512 x264 never runs that code).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("av")

VIDEOS = Path(__file__).resolve().parents[1] / "fixtures" / "videos"
REPO = Path(__file__).resolve().parents[2]

PACK = """
import hashlib, json, sys
junk = [bytearray(n % 4093 + 17) for n in range(int(sys.argv[4]))]
from packer.api import pack_videos
from packer.formats import open_reader
pack_videos(sys.argv[1], sys.argv[2], to="lmdb", codec=sys.argv[3], max_frames=int(sys.argv[5]), workers=0)
r = open_reader(sys.argv[2])
print(json.dumps({r.keys[i]: hashlib.sha256(bytes(r.sample(i).data)).hexdigest() for i in range(len(r))}))
"""


def _pack(src: Path, out: Path, codec: str, perturb: int, junk: int, frames: int) -> dict[str, str]:
    env = {**os.environ, "MALLOC_PERTURB_": str(perturb),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", PACK, str(src), str(out), codec, str(junk), str(frames)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("codec,frames", [("h264", 32), ("hevc", 16), ("av1", 16)])
def test_two_fresh_processes_store_the_same_bytes(tmp_path, codec, frames):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    # 340x256 after the default --short-side 256: a width that is no multiple of 16 macroblocks
    for name in ("mmaction2_test.mp4", "decord_flipping_a_pancake.mkv"):
        shutil.copy(VIDEOS / name, src / name)
    first = _pack(src.parent, tmp_path / "a.lmdb", codec, perturb=85, junk=0, frames=frames)
    second = _pack(src.parent, tmp_path / "b.lmdb", codec, perturb=170, junk=20000, frames=frames)
    assert sorted(first) == ["c/decord_flipping_a_pancake.mkv", "c/mmaction2_test.mp4"]
    assert first == second
