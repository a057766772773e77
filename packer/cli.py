"""The ``packer`` command line: each command parses, calls one library function, and turns
``PackerError`` into a one-line ``click`` error. No logic lives here."""
from __future__ import annotations

import functools
import json
import logging
import sys
from typing import Any, Callable

import click

from . import __version__
from .errors import PackerError
from .executors import EXECUTORS
from .sources import DEFAULT_VIDEO_EXTS

__all__ = ["main"]


def _library_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command body, mapping PackerError to a clean one-line ClickException."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PackerError as e:
            raise click.ClickException(str(e)) from None

    return wrapper


def _split_paths(paths: tuple[str, ...], list_file: str | None, root: str | None) -> tuple[str, str]:
    """``SRC OUT``, or just ``OUT`` with ``--list FILE --root DIR``."""
    if root is not None and len(paths) == 1:
        return root, paths[0]
    if len(paths) == 2 and root is None:
        return paths[0], paths[1]
    raise click.UsageError("expected SRC OUT (or OUT with --root DIR)")


def input_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options that choose the input items."""
    fn = click.option("--ext", default="jpg,jpeg,png,webp,bmp", show_default=True,
                      help="Comma-separated file extensions to take (case-insensitive).")(fn)
    fn = click.option("--root", type=click.Path(file_okay=False), default=None,
                      help="Folder the --list paths are relative to (then give only OUT).")(fn)
    fn = click.option("--list", "list_file", type=click.Path(dir_okay=False), default=None,
                      help="List file of 'relative/path label' lines instead of an ImageFolder tree.")(fn)
    return fn


def conversion_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options every conversion command shares."""
    fn = _with_ray_address(fn)
    fn = click.option("--ray-address", default=None, metavar="ADDR",
                      help="Ray cluster to join with --executor ray ('auto', 'ray://head:10001'; "
                           "default: RAY_ADDRESS, else a local Ray instance).")(fn)
    fn = click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
                      help="Where the per-item work runs: local process pool or a Ray cluster.")(fn)
    fn = click.option("--shard-index", type=int, default=0, show_default=True,
                      help="Which part of the input this job converts (with --num-shards).")(fn)
    fn = click.option("--num-shards", type=int, default=1, show_default=True,
                      help="Split the sorted input into N parts across jobs.")(fn)
    fn = click.option("--overwrite", is_flag=True, help="Replace an existing output.")(fn)
    fn = click.option("--resume", is_flag=True,
                      help="Continue an interrupted run (a finished output is checked and kept).")(fn)
    fn = click.option("--max-failures", type=int, default=0, show_default=True,
                      help="Bad inputs tolerated before the exit status is 1.")(fn)
    fn = click.option("--workers", type=int, default=None,
                      help="Worker processes (default: all cores; 0 = in this process).")(fn)
    return fn


def _with_ray_address(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Fold ``--ray-address`` into the ``executor`` spec (``ray:ADDR``) so commands pass one value."""

    @functools.wraps(fn)
    def wrapper(*args: Any, ray_address: str | None = None, **kwargs: Any) -> Any:
        if ray_address is not None:
            if kwargs.get("executor") != "ray":
                raise click.UsageError("--ray-address needs --executor ray")
            kwargs["executor"] = f"ray:{ray_address}"
        return fn(*args, **kwargs)

    return wrapper


def resize_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The resize options (``packer resize`` and every image pack command), passed to the
    command as one ``resize`` argument: a ``packer.resize.ResizeSpec``, or None without them."""

    @functools.wraps(fn)
    def wrapper(*args: Any, short_side: Any, max_side: Any, size: Any, fit: Any, upscale: bool,
                out_format: Any, quality: Any, **kwargs: Any) -> Any:
        from .resize import ResizeSpec

        try:
            kwargs["resize"] = ResizeSpec.from_options(short_side=short_side, max_side=max_side, size=size,
                                                       fit=fit, upscale=upscale, format=out_format,
                                                       quality=quality)
        except PackerError as e:
            raise click.UsageError(str(e)) from None
        return fn(*args, **kwargs)

    wrapper = click.option("--quality", type=int, default=None,
                           help="JPEG/WebP quality of re-encoded images, 1-100.  [default: 90]")(wrapper)
    wrapper = click.option("--format", "out_format", type=click.Choice(["keep", "jpeg", "png", "webp"]),
                           default=None, help="Format of re-encoded images.  [default: keep]")(wrapper)
    wrapper = click.option("--upscale", is_flag=True, help="Also enlarge images smaller than the target.")(wrapper)
    wrapper = click.option("--fit", type=click.Choice(["crop", "pad", "stretch"]), default=None,
                           help="With --size: cover and centre-crop, fit inside and pad, or stretch.  "
                                "[default: crop]")(wrapper)
    wrapper = click.option("--size", default=None, metavar="WxH",
                           help="Resize to exactly WIDTHxHEIGHT (see --fit).")(wrapper)
    wrapper = click.option("--max-side", type=int, default=None, help="Resize so the long side is N pixels.")(wrapper)
    wrapper = click.option("--short-side", type=int, default=None,
                           help="Resize so the short side is N pixels (aspect ratio kept).")(wrapper)
    return wrapper


def _finish(report: Any, max_failures: int) -> None:
    click.echo(report.summary())
    for f in report.failures[:10]:
        what = "kept" if f["stage"] == "partial" else "failed"  # partial decodes are packed
        click.echo(f"  {what} [{f['stage']}] {f['source']}: {f['reason']}", err=True)
    if len(report.failures) > 10:
        click.echo(f"  ... and {len(report.failures) - 10} more (see failures.jsonl)", err=True)
    if report.failed > max_failures:
        click.echo(f"error: {report.failed} inputs failed (--max-failures {max_failures})", err=True)
        sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="packer")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """packer: pre-decode, pre-resize and pack datasets offline, then stream them back fast."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def image_pack_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Everything an image pack command takes: input, conversion, ``--check`` and resize options."""
    fn = resize_options(fn)
    fn = click.option("--check", type=click.Choice(["full", "header", "none"]), default="full",
                      show_default=True, help="How much of each image to decode to decide it is good "
                                              "(with a resize every image is fully decoded).")(fn)
    return input_options(conversion_options(fn))


def commit_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--commit-every``: the durable-commit granularity of a single-output pack command."""
    return click.option("--commit-every", type=click.IntRange(min=1), default=1000, show_default=True,
                        help="Samples per durable commit (what a --resume after a kill redoes at most; "
                             "for decode-frames --to records, the frames per shard).")(fn)


def _pack(format: str, paths: tuple[str, ...], list_file: str | None, root: str | None, ext: str,
          max_failures: int, commit_every: int | None = None, writer_options: dict[str, Any] | None = None,
          **options: Any) -> None:
    """The body of every image pack command: one ``pack_images`` call, then the summary."""
    from .pack import pack_images

    src, out = _split_paths(paths, list_file, root)
    if commit_every is not None:
        writer_options = {**(writer_options or {}), "commit_every": commit_every}
    report = pack_images(src, out, format=format, list_path=list_file, exts=ext, max_failures=max_failures,
                         writer_options=writer_options, **options)
    _finish(report, max_failures)


@main.command("to-lmdb")
@click.argument("paths", nargs=-1, required=True, metavar="SRC OUT")
@image_pack_options
@commit_option
@_library_call
def to_lmdb(paths, **options):
    """Pack an image folder into LMDB (Caffe Datum values, DALI-readable)."""
    _pack("lmdb", paths, **options)


@main.command("to-hdf5")
@click.argument("paths", nargs=-1, required=True, metavar="SRC OUT.h5")
@click.option("--raw", is_flag=True, help="Store decoded HxWx3 uint8 pixels (needs --size WxH).")
@image_pack_options
@commit_option
@_library_call
def to_hdf5(paths, **options):
    """Pack an image folder into one HDF5 file (encoded blobs, or raw pixels with --raw --size WxH)."""
    _pack("hdf5", paths, **options)


@main.command("resize")
@click.argument("src", type=click.Path(file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
@resize_options
@click.option("--ext", default="jpg,jpeg,png,webp,bmp", show_default=True,
              help="Comma-separated file extensions to take (case-insensitive).")
@click.option("--list", "list_file", type=click.Path(dir_okay=False), default=None,
              help="Resize only the files of this list ('relative/path label' lines, relative to SRC).")
@click.option("--workers", type=int, default=None, help="Worker processes (default: all cores; 0 = in this process).")
@click.option("--max-failures", type=int, default=0, show_default=True,
              help="Bad inputs tolerated before the exit status is 1.")
@click.option("--executor", type=click.Choice(["local"]), default="local", show_default=True,
              help="Where the per-image work runs.")
@_library_call
def resize_cmd(src, out, resize, ext, list_file, workers, max_failures, executor):
    """Mirror the images under SRC into OUT, resized (incremental: a rerun redoes only what changed)."""
    from .mirror import resize_tree

    if resize is None:
        raise click.UsageError("give --short-side N, --max-side N or --size WxH")
    report = resize_tree(src, out, resize, list_path=list_file, exts=ext, workers=workers,
                         executor=executor, max_failures=max_failures)
    _finish(report, max_failures)


@main.command("to-records")
@click.argument("paths", nargs=-1, required=True, metavar="SRC OUT")
@image_pack_options
@click.option("--shard-size", default="256MB", show_default=True,
              help="Bytes per shard (KB/MB/GB decimal, KiB/MiB/GiB binary).")
@click.option("--samples-per-shard", type=int, default=None,
              help="Records per shard (wins over --shard-size).")
@click.option("--name", default="train", show_default=True, help="Shard names: {name}-{i:05d}.tfrecord.")
@_library_call
def to_records(paths, shard_size, samples_per_shard, name, **options):
    """Pack an image folder into TFRecord shards with DALI .idx indexes (a completed shard is
    what --resume keeps)."""
    _pack("records", paths, writer_options={"shard_size": shard_size, "samples_per_shard": samples_per_shard,
                                            "name": name}, **options)


@main.command("index")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@_library_call
def index(paths):
    """Write a DALI .idx beside each TFRecord file (a folder: each one in it), as tfrecord2idx does."""
    from .formats.records import index_tfrecords

    for path, count in index_tfrecords(paths):
        click.echo(f"{path}.idx: {count} records")


@main.command("decode-frames")
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path())
@click.option("--list", "list_file", type=click.Path(dir_okay=False), default=None,
              help="mmaction2 video list ('relative/path label' lines, relative to SRC).")
@click.option("--csv", "csv_file", type=click.Path(dir_okay=False), default=None,
              help="Kinetics CSV (label,youtube_id,time_start,time_end,split) over the videos in SRC.")
@click.option("--class-index", type=click.Path(dir_okay=False), default=None,
              help="UCF-101 classInd.txt ('1 ApplyEyeMakeup' lines) instead of sorted class folders.")
@click.option("--video-exts", default=",".join(DEFAULT_VIDEO_EXTS), show_default=True,
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
              help="Video decoder (auto: decord, falling back to OpenCV).")
@click.option("--force", is_flag=True, help="Start even when the disk space estimate says it won't fit.")
@conversion_options
@commit_option
@_library_call
def decode_frames_cmd(src, out, list_file, csv_file, class_index, video_exts, to, short_side, size,
                      keep_aspect, fps, stride, max_frames, ext, quality, tmpl, start_index, list_out,
                      strict, timeout, backend, force, workers, max_failures, resume, overwrite,
                      num_shards, shard_index, executor, commit_every):
    """Pre-decode videos into mmaction2 frame folders (or packed shards) once, before training."""
    from .decode_frames import decode_frames

    report = decode_frames(src, out, to=to, list_path=list_file, csv_path=csv_file,
                           class_index=class_index, video_exts=video_exts, short_side=short_side,
                           size=size, keep_aspect=keep_aspect, fps=fps, stride=stride,
                           max_frames=max_frames, ext=ext, quality=quality, tmpl=tmpl,
                           start_index=start_index, list_out=list_out, strict=strict, workers=workers,
                           timeout=timeout, backend=backend, max_failures=max_failures, resume=resume,
                           overwrite=overwrite, force=force, num_shards=num_shards,
                           shard_index=shard_index, executor=executor, commit_every=commit_every)
    _finish(report, max_failures)


@main.command()
@click.argument("path", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--grid", type=click.Path(dir_okay=False), default=None,
              help="Write a contact sheet PNG of a seeded random sample.")
@click.option("--show", type=int, default=5, show_default=True, help="How many samples to list.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the --grid sample.")
@_library_call
def inspect(path, as_json, grid, show, seed):
    """Show what a packed dataset holds (format, count, classes, size, samples)."""
    from .inspection import inspect_dataset, render_grid

    info = inspect_dataset(path, show=show)
    if grid:
        info["grid"] = {"path": grid, "positions": render_grid(path, grid, seed=seed)}
    if as_json:
        click.echo(json.dumps(info, indent=1, ensure_ascii=False))
        return
    click.echo(f"{info['path']}: {info['format']} v{info['format_version']}, {info['kind']}, "
               f"{info['count']} samples, {len(info['classes'])} classes, "
               f"{info['bytes_on_disk'] / 1e6:.1f} MB on disk, {info['failures']} failures at packing")
    if "shards" in info:
        click.echo(f"shards: {info['shards']}")
    if info["classes"]:
        shown = ", ".join(info["classes"][:10]) + (" ..." if len(info["classes"]) > 10 else "")
        click.echo(f"classes: {shown}")
    for s in info["samples"]:
        click.echo(f"  [{s['index']}] {s['key']}  label={s['label']}  {s['format']} "
                   f"{s['width']}x{s['height']}x{s['channels']}  {s['bytes']} bytes")
    if grid:
        click.echo(f"contact sheet: {grid}")


@main.command()
@click.argument("path", type=click.Path(exists=True))
@click.option("--no-decode", is_flag=True, help="Check structure and checksums only.")
@_library_call
def verify(path, no_decode):
    """Read every sample, check checksums and structure; exit 1 on any problem."""
    from .inspection import verify_dataset

    result = verify_dataset(path, decode_images=not no_decode)
    for p in result.problems[:50]:
        click.echo(f"  {p}", err=True)
    if not result.ok:
        click.echo(f"{path}: {len(result.problems)} problems in {result.count} samples", err=True)
        sys.exit(1)
    click.echo(f"{path}: OK ({result.checked} samples checked)")


@main.command()
@click.argument("workdir", type=click.Path(file_okay=False), default="packer-demo")
@click.option("--count", type=int, default=200, show_default=True, help="Images to generate.")
@click.option("--workers", type=int, default=None, help="Worker processes for packing.")
@_library_call
def demo(workdir, count, workers):
    """Generate sample images, pack them to LMDB and read them back (no download)."""
    from .demo import run_demo

    r = run_demo(workdir, count=count, workers=workers)
    click.echo(f"generated {r['samples']} images in {r['source']}")
    click.echo(r["pack"])
    click.echo(f"read back with PackedDataset: {r['read_samples_per_s']:.0f} samples/s "
               f"(first: {r['first']['key']} {r['first']['shape']} {r['first']['dtype']} "
               f"label {r['first']['label']})")
    click.echo(f"next: packer inspect {r['output']} --grid preview.png && packer verify {r['output']}")


@main.command()
@click.argument("paths", nargs=-1, required=True, metavar="PART... OUT")
@click.option("--overwrite", is_flag=True, help="Replace an existing output.")
@click.option("--any-parts", is_flag=True,
              help="Merge any outputs of one format and class list in the order given, not only "
                   "parts 0..N-1 of one --num-shards run.")
@_library_call
def merge(paths, overwrite, any_parts):
    """Combine the parts of a --num-shards conversion into one dataset (same content as one run)."""
    from .merge import merge_parts

    if len(paths) < 2:
        raise click.UsageError("expected PART... OUT")
    report = merge_parts(paths[:-1], paths[-1], overwrite=overwrite, any_parts=any_parts)
    click.echo(report.summary())


def _bench_help() -> str:
    from .bench import JSON_FIELDS, SETTING_FIELDS

    fields = "; ".join(f"{k}: {v}" for k, v in JSON_FIELDS.items())
    per = "; ".join(f"{k}: {v}" for k, v in SETTING_FIELDS.items())
    return ("Is data loading the bottleneck? Times the real DataLoader over PATH for each "
            "--workers value next to the ceiling (the same batches from memory through the same "
            "consumer), gives a verdict per setting, a recommended num_workers, persistent_workers / "
            "prefetch_factor advice and the memory a device cache needs.\n\n"
            f"JSON fields (--json): {fields}.\n\nEach settings[] entry: {per}.")


@main.command(help=_bench_help())
@click.argument("path", type=click.Path(exists=True))
@click.option("--batch-size", type=int, default=64, show_default=True, help="Samples per batch.")
@click.option("--workers", "workers_text", default="0,1,2", show_default=True,
              help="Comma-separated num_workers values to try.")
@click.option("--decode", type=click.Choice(["fast", "pil", "tensor"]), default="fast", show_default=True,
              help="fast: DCT-scaled decode + resize + centre crop; pil: the torchvision-style Pillow "
                   "pipeline; tensor: full-size decode (pre-resized data of one size).")
@click.option("--resize", type=int, default=256, show_default=True, help="Short side to resize to.")
@click.option("--crop", type=int, default=224, show_default=True, help="Centre crop side.")
@click.option("--against", type=click.Path(exists=True, file_okay=False), default=None,
              help="The original image folder: run the same pipeline over its files, as a ratio.")
@click.option("--steps", type=int, default=30, show_default=True, help="Batches timed per setting.")
@click.option("--model-ms", type=float, default=0.0, show_default=True,
              help="Simulate a training step of this many ms per batch.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of samples/s against num_workers (needs packer[plot]).")
@_library_call
def bench(path, batch_size, workers_text, decode, resize, crop, against, steps, model_ms, as_json, plot):
    from .bench import format_report, parse_workers, plot_bench, run_bench

    result = run_bench(path, batch_size=batch_size, workers=parse_workers(workers_text), decode=decode,
                       resize=resize, crop=crop, against=against, steps=steps, model_ms=model_ms)
    if plot:
        plot_bench(result, plot)
    click.echo(json.dumps(result, indent=1) if as_json else format_report(result))
