"""Image commands: ``to-{format}`` for each registered image format, ``resize`` and ``index``.

``to-lmdb``, ``to-hdf5`` and ``to-records`` are written out (each has its own flags); any other
format in ``packer.formats.FORMATS`` gets a ``to-{name}`` with the common flags.
"""
from __future__ import annotations

from typing import Any

import click

from packer.cli.options import (break_lock_option, commit_option, conversion_call, image_pack_options,
                                library_call, main, resize_options, split_paths)
from packer.formats import FORMATS


def _pack(format: str, paths: tuple[str, ...], list_file: str | None, root: str | None, ext: str,
          **options: Any) -> None:
    """The body of every image pack command: one ``packer.pack`` call, then the summary."""
    from packer.api import pack

    src, out = split_paths(paths, list_file, root)
    conversion_call(lambda: pack(src, out, format=format, list_path=list_file, exts=ext, **options))


# One click command per format on purpose (each its own help and format flags); _pack holds the logic.
@main.command("to-lmdb")
@click.argument("paths", nargs=-1, required=True, metavar="SRC OUT")
@image_pack_options
@commit_option
@library_call
def to_lmdb(paths, **options):
    """Pack an image folder into LMDB (Caffe Datum values, DALI-readable)."""
    _pack("lmdb", paths, **options)


@main.command("to-hdf5")
@click.argument("paths", nargs=-1, required=True, metavar="SRC OUT.h5")
@click.option("--raw", is_flag=True, help="Store decoded HxWx3 uint8 pixels (needs --size WxH).")
@image_pack_options
@commit_option
@library_call
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
@break_lock_option
@library_call
def resize_cmd(src, out, resize, ext, list_file, workers, max_failures, executor, break_lock):
    """Mirror the images under SRC into OUT, resized (incremental: a rerun redoes only what changed)."""
    if resize is None:
        raise click.UsageError("give --short-side N, --max-side N or --size WxH")
    from packer.api import resize as resize_images

    conversion_call(lambda: resize_images(src, out, resize, list_path=list_file, exts=ext, workers=workers,
                                          max_failures=max_failures, break_lock=break_lock))


@main.command("to-records")
@click.argument("paths", nargs=-1, required=True, metavar="SRC OUT")
@image_pack_options
@click.option("--shard-size", default="256MB", show_default=True,
              help="Bytes per shard (KB/MB/GB decimal, KiB/MiB/GiB binary).")
@click.option("--samples-per-shard", type=int, default=None,
              help="Records per shard (wins over --shard-size).")
@click.option("--name", default="train", show_default=True, help="Shard names: {name}-{i:05d}.tfrecord.")
@library_call
def to_records(paths, shard_size, samples_per_shard, name, **options):
    """Pack an image folder into TFRecord shards with DALI .idx indexes (a completed shard is
    what --resume keeps)."""
    _pack("records", paths, shard_size=shard_size, samples_per_shard=samples_per_shard, name=name, **options)


@main.command("index")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@break_lock_option
@library_call
def index(paths, break_lock):
    """Write a DALI .idx beside each TFRecord file (a folder: each one in it), as tfrecord2idx does.

    Each PATH is claimed while its indexes are written (PATH.lock beside a folder,
    FILE.idx.lock beside a file)."""
    from packer.api import index as index_files

    for path, count in index_files(paths, break_lock=break_lock):
        click.echo(f"{path}.idx: {count} records")


def format_command(group: click.Group, name: str) -> click.Command:
    """Add ``to-{name}`` to ``group``: pack an image folder into format ``name`` with the common
    flags (a format whose writer takes more gets a command of its own above)."""

    @group.command(f"to-{name}", help=f"Pack an image folder into the {name} format.")
    @click.argument("paths", nargs=-1, required=True, metavar="SRC OUT")
    @image_pack_options
    @commit_option
    @library_call
    def to_format(paths, **options):
        _pack(name, paths, **options)

    return to_format


for _name in FORMATS:  # a registered image format without a command above
    if f"to-{_name}" not in main.commands:
        format_command(main, _name)
