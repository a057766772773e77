"""``decode-frames``: videos to mmaction2 frame folders or packed shards."""
from __future__ import annotations

import click

from packer.cli.options import commit_option, conversion_options, finish, library_call, main
from packer.conversion.inputs import DEFAULT_VIDEO_EXTS


@main.command("decode-frames")
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path())
@click.option("--list", "list_path", type=click.Path(dir_okay=False), default=None,
              help="mmaction2 video list ('relative/path label' lines, relative to SRC).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Kinetics CSV (label,youtube_id,time_start,time_end,split) over the videos in SRC.")
@click.option("--class-index", type=click.Path(dir_okay=False), default=None,
              help="UCF-101 classInd.txt ('1 ApplyEyeMakeup' lines) instead of sorted class folders.")
@click.option("--video-exts", "exts", default=",".join(DEFAULT_VIDEO_EXTS), show_default=True,
              help="Comma-separated video file extensions to take.")
@click.option("--to", "to", default="frames", show_default=True, metavar="FORMAT",
              help="frames (mmaction2 frame folders) or a packed format: lmdb, hdf5, records.")
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
              help="Video decoder (auto: OpenCV, falling back to decord; see docs/writing.md).")
@click.option("--force", is_flag=True, help="Start even when the disk space estimate says it won't fit.")
@conversion_options
@commit_option
@library_call
def decode_frames_cmd(src, out, to, list_out, **options):
    """Pre-decode videos into mmaction2 frame folders (or packed shards) once, before training."""
    from packer.commands.decode_frames import decode_frames

    report = decode_frames(src, out, to=to, list_out=list_out, **options)
    finish(report, options["max_failures"])
