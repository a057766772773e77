"""Options and helpers shared by the commands: each option group once, the library-call
wrapper that turns ``PackerError`` into a one-line error, and the report printer."""
from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable

import click

from packer import __version__
from packer.conversion.options import EXECUTORS, SOURCE_FORMATS
from packer.errors import PackerError, TooManyFailures

__all__ = ["main", "input_options", "conversion_options", "resize_options", "image_pack_options",
           "commit_option", "library_call", "conversion_call", "split_paths", "break_lock_option"]


def library_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command body, mapping PackerError to a clean one-line ClickException."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PackerError as e:
            err = click.ClickException(str(e))
            err.exit_code = getattr(e, "exit_code", 1)  # ResumeRefused, OutputClaimed: 2
            raise err from e

    return wrapper


def split_paths(paths: tuple[str, ...], list_file: str | None, root: str | None) -> tuple[str, str]:
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
                      help="Folder the --list, --coco or --manifest paths are relative to (then give only OUT).")(fn)
    fn = click.option("--list", "list_file", type=click.Path(dir_okay=False), default=None,
                      help="List file of 'relative/path label' lines instead of an ImageFolder tree.")(fn)
    fn = click.option("--class-index", default=None, metavar="FILE|NAME",
                      help="Number the class folders as the training classes are: the training "
                           "tree or its packed output, a label map (one name per line), "
                           "classInd.txt ('1 name' lines) or a built-in map's name; for a "
                           "validation tree that lacks some classes. Default: the folders sorted "
                           "(byte order, as torchvision's ImageFolder).")(fn)
    return fn


BREAK_LOCK_HELP = ("Take the claim on OUT (OUT.lock) even from a run that may still be alive. RISK: if "
                   "that run is alive (another terminal, a requeued job, another host), both write and "
                   "the one that loses the claim fails at its next commit or its publish (it never "
                   "publishes); use it only when the holder named "
                   "in the error is certainly gone. A dead holder's claim needs no --break-lock: "
                   "--resume takes it over.")


def break_lock_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--break-lock``: every command that writes an output has it."""
    return click.option("--break-lock", is_flag=True, help=BREAK_LOCK_HELP)(fn)


def conversion_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options every conversion command shares."""
    fn = break_lock_option(fn)
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
    fn = click.option("--prune", is_flag=True,
                      help="With --append: the new version leaves out the samples whose inputs are gone "
                           "or changed (otherwise they are reported and kept).")(fn)
    fn = click.option("--append", is_flag=True,
                      help="Add the inputs not in OUT yet after its samples, as its next version (the "
                           "samples there stay byte for byte; the options must be the pack's; new "
                           "classes get the next labels); rerun to complete an interrupted append. "
                           "Image, frame and video packs, field packs of a grown --coco file or --manifest, and "
                           "dataset sources grown by shards or files (see docs/append.md).")(fn)
    fn = click.option("--overwrite", is_flag=True, help="Replace an existing output.")(fn)
    fn = click.option("--resume", is_flag=True,
                      help="Continue an interrupted run with the same options and inputs (a differing "
                           "run is refused, exit 2); a finished output is verified and kept; with a URL "
                           "OUT the upload resumes too; takes over the claim of a run that died.")(fn)
    fn = click.option("--max-failures", type=int, default=0, show_default=True,
                      help="Bad inputs tolerated before the exit status is 1.")(fn)
    fn = click.option("--workers", type=int, default=None,
                      help="Worker processes (default: what is fastest for the format and --check: "
                           "all cores, or this process for a header check into LMDB/HDF5; "
                           "0 = in this process). See docs/writing.md.")(fn)
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
    command as one ``resize`` argument: a ``packer.codecs.resize.ResizeSpec``, or None without them."""

    @functools.wraps(fn)
    def wrapper(*args: Any, short_side: Any, max_side: Any, size: Any, fit: Any, upscale: bool,
                out_format: Any, quality: Any, **kwargs: Any) -> Any:
        from packer.codecs.resize import ResizeSpec

        try:
            kwargs["resize"] = ResizeSpec.from_options(short_side=short_side, max_side=max_side, size=size,
                                                       fit=fit, upscale=upscale, format=out_format,
                                                       quality=quality)
        except PackerError as e:
            raise click.UsageError(str(e)) from e
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


class PathOrUrl(click.ParamType):
    """An existing local path, or a URL (``s3://``, ``https://``, ...) read through the cache."""

    name = "PATH|URL"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        from packer.remote.url import is_url

        if is_url(value):
            return value
        return click.Path(exists=True).convert(value, param, ctx)


PATH_OR_URL = PathOrUrl()


def conversion_call(call: Callable[[], Any]) -> None:
    """Run a library conversion and print what the command prints: the upload (a URL OUT),
    the summary, the first failures; exit 1 when more inputs failed than ``--max-failures``."""
    try:
        report, too_many = call(), None
    except TooManyFailures as e:  # the output is published; the command still exits 1
        report, too_many = e.report, e
    if getattr(report, "upload", None) is not None:
        click.echo(report.upload.summary())
    if getattr(report, "labels", ""):
        click.echo(f"labels: {report.labels}")
    click.echo(report.summary())
    for f in report.failures[:10]:
        what = "kept" if f["stage"] == "partial" else "failed"  # partial decodes are packed
        click.echo(f"  {what} [{f['stage']}] {f['source']}: {f['reason']}", err=True)
    if len(report.failures) > 10:
        click.echo(f"  ... and {len(report.failures) - 10} more (see failures.jsonl)", err=True)
    if too_many is not None:
        click.echo(f"error: {too_many}", err=True)
        sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="packer")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """packer: pre-decode, pre-resize and pack datasets offline, then stream them back fast.

    The OUT of to-lmdb, to-hdf5, to-records, decode-frames and merge may be a URL (s3://,
    gs://, ...): the output is built in a local staging folder ($PACKER_STAGING_DIR) and
    uploaded, the manifest last. inspect, verify, merge and export read URLs (https://, s3://, ...)
    through a node-local cache ($PACKER_CACHE_DIR). Credentials come from the environment and
    config files only. See docs/remote.md.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def image_pack_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Everything an image pack command takes: input, conversion, ``--check`` and resize options."""
    fn = resize_options(fn)
    fn = click.option("--shuffle", "shuffle", type=click.IntRange(min=0), default=None, metavar="SEED",
                      help="Store the samples in a permutation of the inputs fixed by SEED (keys still "
                           "name the sources), so that reading in stored order mixes classes; "
                           "recorded in the manifest. Default: sorted input order.")(fn)
    fn = click.option("--source-format", type=click.Choice(SOURCE_FORMATS), default=None, metavar="KIND",
                      help="What SRC is: a class-folder tree (folder), WebDataset .tar shards (wds: a file, a "
                           "folder of them, a brace pattern shard-{000000..000099}.tar, a URL), a "
                           "Dataset.save_to_disk folder (hf) or Parquet files (parquet). Default: detected "
                           "from SRC (docs/sources.md).")(fn)
    fn = click.option("--check", type=click.Choice(["full", "header", "none"]), default="full",
                      show_default=True, help="How much of each image to decode to decide it is good "
                                              "(with a resize every image is fully decoded).")(fn)
    fn = append_to_option(fn)
    return field_options(input_options(conversion_options(fn)))


def append_to_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--append-to PACK``: a split append's job (image, field and video commands)."""
    return click.option("--append-to", type=click.Path(), default=None, metavar="PACK",
                        help="A split append: OUT becomes part --shard-index of --num-shards of the inputs "
                             "PACK lacks (new classes labelled after its own); `packer merge PARTS... PACK "
                             "--append` adds the parts to PACK as its next version (docs/append.md).")(fn)


def _schema_option(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, str] | None:
    """``--schema NAME=TYPE`` (repeated) as ``{name: type}``."""
    if not value:
        return None
    out = {}
    for text in value:
        name, sep, spec = text.partition("=")
        if not sep or not name.strip() or not spec.strip():
            raise click.BadParameter(f"{text!r}: give NAME=TYPE (e.g. boxes=ndarray:float32:*,4)")
        out[name.strip()] = spec.strip()
    return out


def field_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The sources of samples with many fields (docs/fields.md): a COCO file or a sample manifest."""
    fn = click.option("--drop-empty", is_flag=True,
                      help="With --coco: leave out images without annotations (kept by default).")(fn)
    fn = click.option("--schema", multiple=True, callback=_schema_option, metavar="NAME=TYPE",
                      help="With --manifest: a column's type (repeat per column; default: inferred "
                           "from the first row). Types: image, int, float, str, bytes, json, labels, "
                           "ndarray:DTYPE[:SHAPE] (e.g. ndarray:float32:*,4), rle.")(fn)
    fn = click.option("--manifest", type=click.Path(dir_okay=False), default=None,
                      help="Pack a sample manifest (.jsonl, .csv, .parquet; a row per sample, a field "
                           "per column, image paths relative to --root) instead of an image tree.")(fn)
    fn = click.option("--coco", type=click.Path(dir_okay=False), default=None,
                      help="Pack a COCO instances or captions JSON over the images under --root: "
                           "one sample per image with its boxes, labels, crowd flags and masks.")(fn)
    return fn


def commit_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--commit-every``: the durable-commit granularity of a single-output pack command."""
    return click.option("--commit-every", type=click.IntRange(min=1), default=1000, show_default=True,
                        help="Samples per durable commit (what a --resume after a kill redoes at most; "
                             "for decode-frames --to records, the frames per shard).")(fn)
