"""``decode-frames``: videos to mmaction2 frame folders or packed shards; ``pack-videos``: videos
re-encoded and packed as video."""
from __future__ import annotations

import click

from packer.cli.options import (append_to_option, commit_option, conversion_call, conversion_options, library_call,
                                main)
from packer.conversion.options import DEFAULT_VIDEO_EXTS
from packer.formats import FORMATS


@main.command("decode-frames")
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("out")
@click.option("--list", "list_path", type=click.Path(dir_okay=False), default=None,
              help="mmaction2 video list, relative to SRC: 'path label', 'path l1 l2 ...' (multi-label) "
                   "or 'path' (no label: -1, or its folder's class with --class-index).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Kinetics CSV (label,youtube_id,time_start,time_end,split) over the videos in SRC.")
@click.option("--class-index", default=None, metavar="FILE|NAME",
              help="Class names by label: UCF-101 classInd.txt ('1 ApplyEyeMakeup', 1-based; list labels "
                   "become 0-based), a label map (one name per line, mmaction2's label_map_k400.txt), "
                   "the Kinetics training CSV, the training tree or its packed output, or a "
                   "built-in map: ucf101, hmdb51, kinetics400, "
                   "kinetics600, kinetics700, sthv2. Default: class folders of one of those datasets "
                   "take its map (a part of its classes, e.g. a validation tree, is refused); other "
                   "class folders / CSV labels are sorted as mmaction2 sorts them.")
@click.option("--video-exts", "exts", default=",".join(DEFAULT_VIDEO_EXTS), show_default=True,
              help="Comma-separated video file extensions to take.")
@click.option("--to", "to", default="frames", show_default=True, metavar="FORMAT",
              help=f"frames (mmaction2 frame folders) or a packed format: {', '.join(FORMATS)}.")
@click.option("--short-side", type=int, default=None, help="Rescale frames so the short side is N.")
@click.option("--size", default=None, help="Rescale frames to fit WxH (0 on a side: from the aspect).")
@click.option("--keep-aspect/--no-keep-aspect", default=True, show_default=True,
              help="With --size: keep the aspect ratio (fit inside) or stretch to exactly WxH.")
@click.option("--fps", type=float, default=None, help="Resample to F frames per second (by timestamps).")
@click.option("--stride", type=int, default=None, help="Keep every K-th frame.")
@click.option("--max-frames", type=int, default=None, help="Keep at most N frames per video.")
@click.option("--ext", type=click.Choice(["jpg", "png"]), default="jpg", show_default=True,
              help="Frame image format.")
@click.option("--quality", type=int, default=95, show_default=True, help="JPEG quality.")
@click.option("--tmpl", default=None, help="Frame file names (default img_{:05d}.EXT).")
@click.option("--start-index", type=int, default=1, show_default=True, help="Number of the first frame file.")
@click.option("--list-out", type=click.Path(dir_okay=False), default=None,
              help="Also write the rawframes list here (default: OUT/rawframes.txt).")
@click.option("--strict", is_flag=True, help="Partial decodes count toward --max-failures.")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds one video may take before its worker is killed (0: no limit).")
@click.option("--backend", type=click.Choice(["auto", "decord", "opencv"]), default="auto", show_default=True,
              help="Video decoder (auto: OpenCV, falling back to decord when OpenCV cannot open a "
                   "video or decodes fewer frames than it claims; chosen by measurement, see "
                   "docs/writing.md).")
@click.option("--force", is_flag=True, help="Start even when the disk space estimate says it won't fit.")
@click.option("--task", type=click.Choice(["rgb", "flow", "both"]), default="rgb", show_default=True,
              help="RGB frames, optical flow (x/y grey images), or both (mmaction2 build_rawframes --task).")
@click.option("--flow", "flow", type=click.Choice(["tvl1", "farneback", "dis"]), default="tvl1",
              show_default=True, help="Flow method between consecutive selected frames (TV-L1 needs "
              "opencv-contrib; dis is the fast one).")
@click.option("--bound", type=float, default=20.0, show_default=True,
              help="Flow quantization bound: clip to [-B, B] pixels, then map onto 0..255.")
@click.option("--flow-tmpl", default=None, help="Flow file names: direction, then number "
              "(default {}_{:05d}.EXT).")
@conversion_options
@append_to_option
@commit_option
@library_call
def decode_frames_cmd(src, out, to, list_out, **options):
    """Pre-decode videos into mmaction2 frame folders (or packed shards) once, before training.

    Defaults, chosen by measurement (docs/writing.md): one worker process per core, each
    decoding one video at a time on one decoder thread, OpenCV first (--backend auto)."""
    from packer.api import decode_frames

    conversion_call(lambda: decode_frames(src, out, to=to, list_out=list_out, **options))


@main.command("pack-videos")
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("out")
@click.option("--list", "list_path", type=click.Path(dir_okay=False), default=None,
              help="mmaction2 video list, relative to SRC (as decode-frames).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Kinetics CSV (label,youtube_id,time_start,time_end,split) over the videos in SRC.")
@click.option("--class-index", type=click.Path(dir_okay=False), default=None,
              help="Class names by label (as decode-frames).")
@click.option("--video-exts", "exts", default=",".join(DEFAULT_VIDEO_EXTS), show_default=True,
              help="Comma-separated video file extensions to take.")
@click.option("--to", "to", default="records", show_default=True, metavar="FORMAT",
              help=f"A packed format: {', '.join(FORMATS)}; or files: plain MP4 files in a tree mirroring "
                   "the inputs plus the mmaction2 video list OUT/videos.txt (its VideoDataset reads them).")
@click.option("--short-side", type=int, default=256, show_default=True,
              help="Rescale so the short side is N (sides rounded down to even).")
@click.option("--fps", type=float, default=None, help="Resample to F frames per second (by timestamps).")
@click.option("--stride", type=int, default=None, help="Keep every K-th frame.")
@click.option("--max-frames", type=int, default=None, help="Keep at most N frames per video.")
@click.option("--codec", type=click.Choice(["h264", "hevc", "av1"]), default="h264", show_default=True,
              help="Codec of the re-encoded videos, through PyAV's FFmpeg: libx264, libx265 or SVT-AV1 (decoded "
                   "by dav1d); see docs/video.md for what each costs and saves.")
@click.option("--copy", is_flag=True,
              help="Keep each source's video stream as it is (no decode, resize or re-encode), indexed for "
                   "frame-exact reads; a stream that cannot be indexed safely is a recorded failure.")
@click.option("--gop", type=int, default=8, show_default=True,
              help="Frames from one keyframe to the next: a clip decodes from the keyframe before its first "
                   "frame (chosen by measurement, see docs/video.md).")
@click.option("--crf", type=int, default=None,
              help="Constant rate factor (lower: better, bigger); default 20 (h264), 21 (hevc), 30 (av1): about the same PSNR.")
@click.option("--preset", default=None,
              help="Encoder speed preset: x264/x265 names (default veryfast), SVT-AV1 0..13 (default 10).")
@click.option("--strict", is_flag=True, help="Partial decodes count toward --max-failures.")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds one video may take before its worker is killed (0: no limit).")
@click.option("--backend", type=click.Choice(["auto", "decord", "opencv"]), default="auto", show_default=True,
              help="Source video decoder (as decode-frames).")
@click.option("--commit-every", type=click.IntRange(min=1), default=100, show_default=True,
              help="Videos per durable commit (what a --resume after a kill redoes at most).")
@conversion_options
@append_to_option
@library_call
def pack_videos_cmd(src, out, to, **options):
    """Re-encode videos for training and pack them as video (H.264, fixed GOP, frame index).

    PackedVideoDataset reads the output with the same sampling options as a frame pack,
    decoding only the keyframe intervals that hold each clip's frames."""
    from packer.api import pack_videos

    conversion_call(lambda: pack_videos(src, out, to=to, **options))
