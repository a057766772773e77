"""Tools over packed outputs: ``inspect``, ``verify``, ``merge``, ``export``, ``bench`` and ``demo``."""
from __future__ import annotations

import json
import sys

import click

from packer.cli.options import PATH_OR_URL, break_lock_option, conversion_call, library_call, main
from packer.formats import FORMATS


@main.command()
@click.argument("path", type=PATH_OR_URL)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--grid", type=click.Path(dir_okay=False), default=None,
              help="Write a contact sheet PNG of a seeded random sample.")
@click.option("--show", type=int, default=5, show_default=True, help="How many samples to list.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the --grid sample.")
@click.option("--grid-boxes/--no-grid-boxes", default=True, show_default=True,
              help="Outline a detection field pack's boxes on the --grid sheet.")
@click.option("--grid-labels", is_flag=True, help="Write each box's class name on the --grid sheet.")
@library_call
def inspect(path, as_json, grid, show, seed, grid_boxes, grid_labels):
    """Show what a packed dataset holds (format, count, classes, size, samples). PATH may be a
    URL (s3://, https://, ...): read through the cache ($PACKER_CACHE_DIR, docs/remote.md)."""
    from packer.api import inspect as inspect_output

    info = inspect_output(path, show=show, grid=grid or None, seed=seed, grid_boxes=grid_boxes,
                          grid_labels=grid_labels)
    if as_json:
        click.echo(json.dumps(info, indent=1, ensure_ascii=False))
        return
    click.echo(f"{info['path']}: {info['format']} v{info['format_version']}, {info['kind']}, "
               f"{info['count']} samples, {len(info['classes'])} classes, "
               f"{info['bytes_on_disk'] / 1e6:.1f} MB on disk, {info['failures']} failures at packing")
    if "shards" in info:
        click.echo(f"shards: {info['shards']}")
    if len(info.get("versions", ())) > 1:
        click.echo(f"versions: {len(info['versions'])} (reading {info['version']}; PackedDataset(path, version=N) "
                   "reads another)")
        for v in info["versions"]:
            added = v.get("added", {}).get("samples")
            what = [f"{v['count']} samples"] + ([f"added stored {added[0]}..{added[1] - 1}"] if added else [])
            if v.get("removed"):
                what.append(f"left out {v['removed'].get('samples', 0)}")
            parent = f" (from {v['parent']})" if v.get("parent") else ""
            click.echo(f"  {v['version']}{parent}: {', '.join(what)}" + (f"  [{v['command']}]" if v.get("command") else ""))
    if "fields" in info:
        click.echo("fields: " + ", ".join(f"{name}:{spec}" for name, spec in info["fields"].items()))
    if info.get("categories"):
        cats = info["categories"]
        shown = ", ".join(f"{c['label']}={c.get('id')} {c.get('name')}" for c in cats[:10])
        click.echo(f"COCO {info.get('coco_kind')} categories (label=id name): {shown}"
                   + (f" ... ({len(cats)})" if len(cats) > 10 else ""))
        named: dict[tuple, list[str]] = {}  # (names, skeleton) -> the labels that name them
        for c in cats:
            if c.get("keypoints"):
                named.setdefault((tuple(c["keypoints"]), len(c.get("skeleton") or ())), []).append(str(c["label"]))
        for (names, edges), labels in named.items():
            click.echo(f"keypoints of label {', '.join(labels[:10])}{' ...' if len(labels) > 10 else ''} "
                       f"({len(names)}, skeleton of {edges} edges): {', '.join(names)}")
    elif info["classes"]:
        shown = ", ".join(info["classes"][:10]) + (" ..." if len(info["classes"]) > 10 else "")
        click.echo(f"classes: {shown}")
    for s in info["samples"]:
        if "fields" in s:
            dims = f"  {s['width']}x{s['height']}x{s['channels']}" if s["width"] else ""  # of the first image
            click.echo(f"  [{s['index']}] {s['key']}{dims}  {s['bytes']} bytes")
            click.echo("      " + "  ".join(f"{k}={v}" for k, v in s["fields"].items()))
            continue
        click.echo(f"  [{s['index']}] {s['key']}  label={s['label']}  {s['format']} "
                   f"{s['width']}x{s['height']}x{s['channels']}  {s['bytes']} bytes")
    if grid:
        click.echo(f"contact sheet: {grid}")


@main.command()
@click.argument("path", type=PATH_OR_URL)
@click.option("--no-decode", is_flag=True, help="Check structure and checksums only.")
@library_call
def verify(path, no_decode):
    """Read every sample, check checksums and structure; exit 1 on any problem. PATH may be a URL
    (every shard is downloaded again from the server and checked against its sha256)."""
    from packer.api import verify as verify_output
    from packer.errors import VerifyFailed

    try:
        result = verify_output(path, decode=not no_decode)
    except VerifyFailed as e:
        for p in e.result.problems[:50]:
            click.echo(f"  {p}", err=True)
        click.echo(str(e), err=True)
        sys.exit(1)
    click.echo(f"{path}: OK ({result.checked} samples checked)")
    for note in result.notes:
        click.echo(f"  {note}")


@main.command()
@click.argument("workdir", type=click.Path(file_okay=False), default="packer-demo")
@click.option("--count", type=int, default=200, show_default=True, help="Images to generate.")
@click.option("--workers", type=int, default=None, help="Worker processes for packing.")
@library_call
def demo(workdir, count, workers):
    """Generate sample images, pack them to LMDB and read them back (no download)."""
    from packer.api import demo as run_demo

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
@click.option("--append", is_flag=True,
              help="The parts are a split append to OUT (made with --append-to OUT): add them to it as "
                   "its next version (refused if OUT holds another version than they were planned against).")
@break_lock_option
@library_call
def merge(paths, overwrite, any_parts, append, break_lock):
    """Combine the parts of a --num-shards conversion into one dataset (same content as one run).
    Parts and OUT may be URLs (parts read through the cache; OUT built locally, then uploaded).

    A part that another run is writing (PART.lock), or a finished part whose rewrite is half
    done (PART.partial beside it, or the claim of a run that died), is refused, named."""
    if len(paths) < 2:
        raise click.UsageError("expected PART... OUT")
    from packer.api import merge as merge_outputs

    report = merge_outputs(paths[:-1], paths[-1], overwrite=overwrite, any_parts=any_parts, break_lock=break_lock,
                           append=append)
    click.echo(report.summary())


@main.command()
@click.argument("pack", type=PATH_OR_URL)
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--to", type=click.Choice(["wds", "parquet"]), required=True,
              help="wds: WebDataset tar shards (webdataset.WebDataset reads them); parquet: Parquet files "
                   "(datasets.load_dataset('parquet', ...) reads them with an Image feature and a ClassLabel "
                   "label; needs packer[export]).")
@click.option("--shard-size", default=None, metavar="SIZE",
              help="Start a new shard before a sample would take it past SIZE bytes (256MB, 1GiB, ...; "
                   "Parquet: the samples' bytes).  [default: 256MB, unless --samples-per-shard alone is given]")
@click.option("--samples-per-shard", type=click.IntRange(min=1), default=None,
              help="At most N samples per shard (with --shard-size: whichever comes first).")
@click.option("--max-failures", type=int, default=0, show_default=True,
              help="Damaged samples tolerated (each recorded in failures.jsonl, never exported) before "
                   "the exit status is 1.")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted export of the same pack with the same options (another pack "
                   "or other options are refused, exit 2); a finished export is checked and kept.")
@click.option("--overwrite", is_flag=True, help="Replace an existing export.")
@break_lock_option
@library_call
def export(pack, out, to, shard_size, samples_per_shard, max_failures, resume, overwrite, break_lock):
    """Export a pack (lmdb, records, hdf5; PACK may be a URL) as WebDataset tar shards or
    Parquet files in the folder OUT: shard-000000.tar (or .parquet), ..., export.json (the
    source pack's identity, each shard's size and sha256) and failures.jsonl. Encoded image
    bytes are copied, never re-encoded (raw-pixel packs: lossless PNG); keys, labels and
    fields keep their order. Every sample is read through the checked reader: a damaged one
    is recorded in failures.jsonl, never exported. See docs/sources.md."""
    from packer.api import export as export_pack

    conversion_call(lambda: export_pack(pack, out, to=to, shard_size=shard_size,
                                        samples_per_shard=samples_per_shard, max_failures=max_failures,
                                        resume=resume, overwrite=overwrite, break_lock=break_lock))


def _bench_help() -> str:
    from packer.benchmark.run import JSON_FIELDS, SETTING_FIELDS

    fields = "; ".join(f"{k}: {v}" for k, v in JSON_FIELDS.items())
    per = "; ".join(f"{k}: {v}" for k, v in SETTING_FIELDS.items())
    return ("Is data loading the bottleneck? Times the real DataLoader over PATH for each "
            "--workers value, each in a fresh process with default settings as a training script starts, "
            "next to the ceiling (the same batches from memory through the same "
            "consumer), gives a verdict per setting, a recommended num_workers, persistent_workers / "
            "prefetch_factor advice and the memory a device cache needs; then packer.Loader's thread "
            "scaling (a pipeline that holds the GIL: use the DataLoader) and distinct classes per "
            "batch of the stored and StreamingDataset orders against a truly random batch. On a "
            "pack-videos output: clips/s, CPU ms per clip and bytes per video from the video pack and "
            "from a frame pack of the same videos, for the sampling given, and which to read.\n\n"
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
@click.option("--transform", default=None, metavar="MODULE:CALLABLE",
              help="Your transform, applied after the decode (e.g. mypkg.aug:train_transform); "
                   "its thread scaling says whether it holds the GIL.")
@click.option("--fidelity", type=int, default=16, show_default=True,
              help="Samples for the fidelity table (PSNR against a full-decode Lanczos reference and "
                   "shift, per fast path beside torchvision's pipeline); 0 skips it.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of samples/s against num_workers (needs packer[plot]).")
@click.option("--write", "write_to", type=click.Choice(list(FORMATS)), default=None,
              help="Bench the write path instead: PATH is an image folder, packed into a scratch output "
                   "of this format once per --workers value; prints the writer's ceiling (samples/s one "
                   "writer absorbs), the 1 -> 2 worker scaling and the model for N cores.")
@click.option("--check", type=click.Choice(["full", "header", "none"]), default="header", show_default=True,
              help="With --write: the --check of the packing runs.")
@click.option("--frames", type=click.Path(exists=True), default=None,
              help="On a pack-videos output: the frame pack of the same videos to compare with (default: "
                   "one made from the video pack's streams in a temporary folder, JPEG q95, same size).")
@click.option("--clips", type=int, default=60, show_default=True,
              help="On a pack-videos output: clips timed per pack and sampling.")
@click.option("--clip-len", type=int, default=None,
              help="On a pack-videos output: frames per clip of the sampling to time (with --frame-interval, "
                   "--num-clips, --test-mode; none given: TSN 8x1 train and dense 32x2 test).")
@click.option("--frame-interval", type=int, default=None, help="On a pack-videos output: frames between taken frames.")
@click.option("--num-clips", type=int, default=None, help="On a pack-videos output: clips (segments) per sample.")
@click.option("--test-mode/--train-mode", "test_mode", default=None,
              help="On a pack-videos output: test-mode (deterministic) or training sampling.")
@library_call
def bench(path, against, as_json, plot, workers_text, write_to, check, **option_fields):
    from packer.api import bench as run_bench
    from packer.benchmark.run import format_report, parse_workers, plot_bench

    result = run_bench(path, workers=parse_workers(workers_text), against=against, write=write_to, check=check,
                       **option_fields)  # every other flag is a parameter of the same name
    if write_to is not None:
        from packer.benchmark.write import format_write_report

        click.echo(json.dumps(result, indent=1) if as_json else format_write_report(result))
        return
    if "rows" in result:  # a pack-videos output: video or frames
        from packer.benchmark.video import format_video_report

        click.echo(json.dumps(result, indent=1) if as_json else format_video_report(result))
        return
    if plot:
        plot_bench(result, plot)
    click.echo(json.dumps(result, indent=1) if as_json else format_report(result))
