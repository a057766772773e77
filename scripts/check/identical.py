"""Pack the same inputs with two packer checkouts and compare the outputs byte for byte.

    git worktree add /tmp/base c0edd86
    python -m scripts.check.identical /tmp/base .

Generates one image folder (with one undecodable file, so ``failures.jsonl`` has a line) and
one video folder (with one broken video), copies them beside each checkout's outputs, and
runs every packing command of both checkouts (``python -m packer ...`` with that checkout
on ``PYTHONPATH``), one checkout after the other in the same working folder (moved aside
between them), so the paths and command line recorded in each manifest are the same. Then every output tree is compared file
by file: the same relative paths, the same bytes.

Excluded from the byte comparison, by default nothing but ``lock.mdb`` (LMDB's reader lock
table: runtime state, not data; readers open without a lock). A manifest (``packer.json``)
that differs is compared again without ``created_by.packer`` (the version string, which may
legitimately differ between checkouts) and reported as ``same but version`` when only that
differs. Prints a markdown table; exits 1 when any output differs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# (name, packer arguments or a list of them, the last one writing the output compared);
# IN = the image folder, VID = the video folder, OUT = outputs
COMMANDS: list[tuple[str, list]] = [
    ("to-lmdb", ["to-lmdb", "IN", "OUT/img.lmdb", "--commit-every", "7"]),
    ("to-lmdb --check header", ["to-lmdb", "IN", "OUT/img_header.lmdb", "--check", "header", "--commit-every", "7"]),
    ("to-lmdb --short-side --format jpeg", ["to-lmdb", "IN", "OUT/img_small.lmdb", "--short-side", "24",
                                            "--format", "jpeg"]),
    ("to-hdf5", ["to-hdf5", "IN", "OUT/img.h5", "--commit-every", "7"]),
    ("to-hdf5 --raw", ["to-hdf5", "IN", "OUT/img_raw.h5", "--raw", "--size", "32x24"]),
    ("to-records", ["to-records", "IN", "OUT/img.records", "--shard-size", "20KB"]),
    ("to-records --samples-per-shard", ["to-records", "IN", "OUT/img_sps.records", "--samples-per-shard", "5"]),
    ("decode-frames --to frames", ["decode-frames", "VID", "OUT/vid.frames", "--to", "frames", "--fps", "10"]),
    ("decode-frames --to lmdb", ["decode-frames", "VID", "OUT/vid.lmdb", "--to", "lmdb", "--short-side", "24"]),
    ("decode-frames --to hdf5", ["decode-frames", "VID", "OUT/vid.h5", "--to", "hdf5", "--stride", "2"]),
    ("decode-frames --to records", ["decode-frames", "VID", "OUT/vid.records", "--to", "records"]),
]
# merges (``Writer.merge_parts``): two --num-shards parts, then ``packer merge``
for _fmt, _cmd, _out, _extra in (("hdf5 --raw", "to-hdf5", "img_merged_raw.h5", ["--raw", "--size", "32x24"]),
                                 ("lmdb", "to-lmdb", "img_merged.lmdb", []),
                                 ("records", "to-records", "img_merged.records", ["--shard-size", "20KB"]),
                                 ("frames", "decode-frames", "vid_merged.frames", ["--to", "frames"])):
    _src = "VID" if _cmd == "decode-frames" else "IN"
    _parts = [f"OUT/part{k}_{_out}" for k in (0, 1)]
    COMMANDS.append((f"merge {_fmt}", [
        *([_cmd, _src, _parts[k], *_extra, "--num-shards", "2", "--shard-index", str(k)] for k in (0, 1)),
        ["merge", *_parts, f"OUT/{_out}"]]))

IGNORED = {"lock.mdb"}


def make_inputs(root: Path, repo: Path) -> tuple[Path, Path]:
    """The image and video folders (packer.synth images, synthetic videos; fixed seeds)."""
    from packer.synth import make_image_folder
    from scripts.bench.common import write_video_folder

    images = make_image_folder(root / "images", count=24, classes=3, size=(40, 56), seed=3)
    (images / "class_1" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    videos = write_video_folder(root / "videos", per_class=2, classes=2, frames=20, size=(40, 56))
    (videos / "class_0" / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 truncated")
    return images, videos


def run_all(checkout: Path, work: Path, images: Path, videos: Path) -> dict[str, str]:
    """Run every command with ``checkout``'s packer in ``work``; name -> error text ('' if ok)."""
    shutil.copytree(images, work / "in_images")
    shutil.copytree(videos, work / "in_videos")
    (work / "out").mkdir()
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONHASHSEED": "0"}
    errors = {}
    for name, args in COMMANDS:
        errors[name] = ""
        for step in _steps(args):
            argv = [a.replace("IN", "in_images").replace("VID", "in_videos").replace("OUT", "out") for a in step]
            if argv[0] != "merge":
                argv += ["--workers", "0"]
            proc = subprocess.run([sys.executable, "-m", "packer", *argv], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=600)
            # exit status 1 = finished with failures recorded (the broken inputs): expected
            if proc.returncode not in (0, 1):
                errors[name] = f"{argv[0]} exit {proc.returncode}: {proc.stderr[-300:]}"
                break
    return errors


def _steps(args: list) -> list[list[str]]:
    return args if isinstance(args[0], list) else [args]


def files_of(out: Path) -> dict[str, Path]:
    """Relative path -> file, for an output folder, or a file plus its ``.failures.jsonl``."""
    if out.is_file():
        found = {out.name: out}
        side = out.with_name(out.name + ".failures.jsonl")
        if side.exists():
            found[side.name] = side
        return found
    return {p.relative_to(out).as_posix(): p for p in sorted(out.rglob("*"))
            if p.is_file() and p.name not in IGNORED}


def _without_version(raw: bytes) -> object:
    d = json.loads(raw)
    d.get("created_by", {}).pop("packer", None)
    return d


def compare(a: Path, b: Path) -> tuple[int, list[str], list[str]]:
    """(files compared, files that differ, files that differ only in the version field)."""
    fa, fb = files_of(a), files_of(b)
    differ = sorted(set(fa) ^ set(fb))
    only_version = []
    for rel in sorted(set(fa) & set(fb)):
        da, db = fa[rel].read_bytes(), fb[rel].read_bytes()
        if da == db:
            continue
        if rel.endswith("packer.json") and _without_version(da) == _without_version(db):
            only_version.append(rel)
        else:
            differ.append(rel)
    return len(set(fa) | set(fb)), differ, only_version


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", type=Path, help="the reference checkout (e.g. a git worktree of main)")
    ap.add_argument("new", type=Path, help="the checkout under test")
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    args = ap.parse_args()
    base, new = args.base.resolve(), args.new.resolve()
    work = args.keep or Path(tempfile.mkdtemp(prefix="check_identical-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        images, videos = make_inputs(work / "inputs", new)
        results = {}
        for label, checkout in (("base", base), ("new", new)):
            run = work / "run"  # the same absolute paths for both (the manifest records --src)
            run.mkdir()
            results[label] = run_all(checkout, run, images, videos)
            run.rename(work / label)
        print(f"base: {base}\nnew:  {new}\n")
        print("| command | output | files | identical bytes | differing files |")
        print("|---|---|---:|---|---|")
        bad = 0
        for name, cmd in COMMANDS:
            out = next(a for a in reversed(_steps(cmd)[-1]) if a.startswith("OUT/")).replace("OUT/", "")
            err = results["base"][name] or results["new"][name]
            if err:
                bad += 1
                print(f"| `{name}` | {out} | - | run failed | {err.splitlines()[-1] if err else ''} |")
                continue
            n, differ, only_version = compare(work / "base" / "out" / out, work / "new" / "out" / out)
            bad += bool(differ)
            verdict = "yes" if not differ and not only_version else ("same but version" if not differ else "NO")
            print(f"| `{name}` | {out} | {n} | {verdict} | {', '.join(differ + only_version) or '-'} |")
        print(f"\n(byte comparison excludes: {', '.join(sorted(IGNORED))}; manifests compared whole)")
        return 1 if bad else 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
