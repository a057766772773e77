"""An append to a video output never costs the version before it, and no video reader sees a
mix of two versions (the video side of tests/faults/test_faults_append.py).

* A SIGKILL at points of a ``decode-frames --append`` or ``pack-videos --append`` (mid-video,
  during a commit, and before each rename of its publish, frame folders moved into the output
  one by one) leaves the output readable and verified as the previous version (or, past the
  manifest's replace, as the whole new one); rerunning the ``--append`` (or ``--append
  --resume``) completes it to what an uninterrupted append gives, nothing left behind.
* A ``PackedVideoDataset`` / ``FrameDataset`` opened before an append, reading during and after
  it (the append in another process), returns only its own version's clips or
  ``OutputChanged``, and still reads them after the publish.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import packer
from packer.errors import OutputChanged
from packer.formats import open_reader
from packer.synth import write_video
from tests.support.inputs import write_video_folder
from tests.faults.test_faults_append import _copy
from tests.faults.test_faults_append import _killed_then_completed as killed_then_completed
from tests.support.killing import packer_cmd, packer_env, run_packer

SIZE = (32, 40)
KINDS = [("decode-frames", "frames"), ("decode-frames", "lmdb"), ("pack-videos", "records"),
         pytest.param(("decode-frames", "hdf5"), marks=pytest.mark.slow),
         pytest.param(("decode-frames", "records"), marks=pytest.mark.slow),
         pytest.param(("pack-videos", "files"), marks=pytest.mark.slow)]


def _out(root: Path, to: str, name: str = "out") -> Path:
    return root / (f"{name}.h5" if to == "hdf5" else f"{name}.{to}")


def _argv(kind: tuple[str, str], src: Path, out: Path, *more) -> list:
    cmd, to = kind
    extra = ("--short-side", "32", "--gop", "4") if cmd == "pack-videos" else ()
    return [cmd, str(src), str(out), "--to", to, "--workers", "0", "--commit-every", "2", *extra, *map(str, more)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(kind) -> (src, v1, reference)``: the grown source tree (4 videos, then 2 more, one
    of a new class), the output of the first 4 (version 1) and an uninterrupted append's result."""
    root, done = tmp_path_factory.mktemp("append-videos-built"), {}

    def get(kind: tuple[str, str]) -> tuple[Path, Path, list]:
        if kind not in done:
            base = root / "-".join(kind)
            src = write_video_folder(base / "src", per_class=2, classes=2, frames=5, size=SIZE)
            v1 = _out(base, kind[1], "v1")
            r = run_packer(*_argv(kind, src, v1))
            assert r.returncode == 0, r.stderr
            write_video(src / "class_1" / "clip_1_9.mp4", frames=6, size=SIZE, seed=91)
            write_video(src / "class_2" / "clip_2_0.mp4", frames=4, size=SIZE, seed=92)
            ref = _copy(v1, base / "ref")
            r = run_packer(*_argv(kind, src, ref, "--append"))
            assert r.returncode == 0, r.stderr
            done[kind] = (src, v1, _samples(ref))
        return done[kind]

    return get


def _samples(out: Path, **kw) -> list[tuple]:
    r = open_reader(out, **kw)
    try:
        return [(k, bytes(rec.data), rec.label) for k, rec in zip(r.keys, (r.read(i) for i in range(len(r))))] \
            + [("videos", [{k: v for k, v in e.items() if k != "source"} for e in r.manifest.videos])]
    finally:
        r.close()


def _killed_then_completed(kind, built, tmp_path: Path, point: str, *, resume: bool = False) -> bool:
    """The image appends' walk (tests/faults/test_faults_append.py) over a video output."""
    return killed_then_completed(kind, built, tmp_path, point, resume=resume, argv=_argv, samples=_samples)


# where in the append's 10 new frames (decode-frames) or 2 new videos (pack-videos) it is killed:
# mid-video or mid-batch, during a commit, after the last sample before the publish
POINTS = {"mid": ("add:3", "add:1"), "commit": ("journal:2", "journal:1"), "last": ("add:10", "add:2")}


@pytest.mark.parametrize("point", ["mid", "commit", pytest.param("last", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: "-".join(k))
def test_a_video_append_killed_while_packing_keeps_the_last_version_and_completes(kind, point, built, tmp_path):
    at = POINTS[point][kind[0] == "pack-videos"]
    assert _killed_then_completed(kind, built, tmp_path, at)


@pytest.mark.parametrize("kind", [("decode-frames", "frames"),
                                  pytest.param(("pack-videos", "files"), marks=pytest.mark.slow),
                                  pytest.param(("decode-frames", "lmdb"), marks=pytest.mark.slow)],
                         ids=lambda k: "-".join(k))
def test_a_video_append_killed_at_each_step_of_its_publish_completes(kind, built, tmp_path):
    """Before every rename of the publish in turn (each new frame folder or video file moved
    into the output, the sidecars, versions/, the manifest), until the append outlives them all."""
    steps = 0
    while _killed_then_completed(kind, built, tmp_path, f"publish:{steps + 1}", resume=steps % 2 == 1):
        steps += 1
        assert steps < 40
    assert steps >= 5


@pytest.mark.parametrize("kind", [("decode-frames", "frames"), ("pack-videos", "records")], ids=lambda k: "-".join(k))
def test_a_video_dataset_opened_before_an_append_reads_only_its_version(kind, built, tmp_path):
    """The append runs in another process while this one reads every clip of a dataset opened
    before it, over and over: each clip is version 1's or OutputChanged, never another; after
    the publish the old dataset still reads version 1, a new one version 2."""
    src, v1, reference = built(kind)
    out = _copy(v1, tmp_path)
    kw = dict(clip_len=2, num_clips=2, test_mode=True)
    ds = packer.FrameDataset(out, **kw) if kind[1] == "frames" else packer.PackedVideoDataset(out, **kw)
    before = [(ds[i][0].numpy().tobytes(), ds[i][1]) for i in range(len(ds))]
    proc = subprocess.Popen(packer_cmd(*_argv(kind, src, out, "--append")), env=packer_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    passes = 0
    while True:
        running = proc.poll() is None
        for i, (clip, label) in enumerate(before):
            try:
                got = ds[i]
            except OutputChanged:
                continue
            assert (got[0].numpy().tobytes(), got[1]) == (clip, label), f"clip {i} is not version 1's"
        passes += 1
        if not running:
            break
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert len(ds) == 4 and [(ds[i][0].numpy().tobytes(), ds[i][1]) for i in range(4)] == before
    assert _samples(out) == reference and passes >= 1
    again = packer.FrameDataset(out, **kw) if kind[1] == "frames" else packer.PackedVideoDataset(out, **kw)
    assert len(again) == 6


def _indices_hold(out: Path) -> list[int]:
    """Every video entry's samples store its ``video_index`` (the entry's ``index``, else its
    position), and no two entries share one; the indices, in entry order."""
    from packer.formats.versions import video_index

    r = open_reader(out)
    try:
        videos = r.manifest.videos
        got = []
        for p, v in enumerate(videos):
            want = video_index(videos, p)
            stored = {r.sample(i).extra["video_index"] for i in range(int(v["start"]), int(v["start"]) + int(v["length"]))}
            assert stored == {want}, (v["key"], stored, want)
            got.append(want)
        assert len(set(got)) == len(got)
        return got
    finally:
        r.close()


def test_a_records_video_index_names_its_entry_after_a_prune(tmp_path):
    """A records frame pack's ``video/index`` is stored once, in the version a video was packed
    in; a ``--prune`` moves entries up, so each moved entry says which index its samples carry
    (``index``), and the videos of later appends take indices never used before."""
    from tests.conversion.test_append_videos import convert, grow

    trees = _trees(tmp_path)
    src = trees["old"]
    out = tmp_path / "out.records"
    convert("decode-frames", src, out, "records")
    assert _indices_hold(out) == [0, 1, 2, 3] and all("index" not in v for v in open_reader(out).manifest.videos)
    sorted(src.rglob("clip_0_0.*"))[0].unlink()
    grow(src, trees)
    assert convert("decode-frames", src, out, "records", append=True, prune=True).version == 2
    assert _indices_hold(out) == [1, 2, 3, 4, 5]
    write_video(src / "class_2" / "clip_2_5.mp4", frames=3, size=SIZE, seed=95)
    assert convert("decode-frames", src, out, "records", append=True).version == 3
    assert _indices_hold(out) == [1, 2, 3, 4, 5, 6] and packer.verify(out).ok
    other = tmp_path / "other.records"
    for c in range(3):
        write_video(tmp_path / "more" / f"class_{c}" / f"zz_{c}.mp4", frames=3, size=SIZE, seed=70 + c)
    convert("decode-frames", tmp_path / "more", other, "records")
    merged = tmp_path / "merged.records"  # a merge renumbers every frame by its entry's position
    packer.merge([out, other], merged, any_parts=True)
    assert _indices_hold(merged) == list(range(9)) and packer.verify(merged).ok


def _trees(root: Path) -> dict[str, Path]:
    """``old``: 4 tiny videos in 2 classes; ``late``: one more in ``class_1`` and one of a new class."""
    old = write_video_folder(root / "old", per_class=2, classes=2, frames=5, size=SIZE)
    write_video(root / "late" / "class_1" / "clip_1_9.mp4", frames=6, size=SIZE, seed=91)
    write_video(root / "late" / "class_2" / "clip_2_0.mp4", frames=4, size=SIZE, seed=92)
    return {"old": old, "late": root / "late"}
