"""``packer.export``: a pack as WebDataset tar shards and as Parquet files, read back by the real
``webdataset`` and ``datasets`` libraries: identical bytes, pixels, keys, labels, class names and
fields, for every registered format and for field packs; shard sizes, the export record, and the
refusals (overlap, overwrite, a missing extra)."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

import packer
from packer.commands.export import EXPORT_NAME, load_export
from packer.commands.export_shards import escape_key, tar_key
from packer.errors import CorruptData, ResumeRefused, UsageError
from packer.formats import FORMATS, open_reader
from packer.synth import natural_image
from tests.support import REPO
from tests.support.inputs import write_image_folder

wds = pytest.importorskip("webdataset")
datasets = pytest.importorskip("datasets")
pytest.importorskip("pyarrow")

ALL = sorted(FORMATS)


def out_path(root: Path, fmt: str, name: str = "pack") -> Path:
    return root / (f"{name}.h5" if FORMATS[fmt][0].single_file else name)


def shards(out: Path, suffix: str) -> list[str]:
    return [str(p) for p in sorted(out.glob(f"shard-*{suffix}"))]


def read_wds(out: Path, decode: str | None = None) -> list[dict]:
    ds = wds.WebDataset(shards(out, ".tar"), shardshuffle=False)
    return list(ds.decode(decode) if decode else ds.decode())


def load_parquet(out: Path, cache: Path, *, decode: bool = True):
    ds = datasets.load_dataset("parquet", data_files=shards(out, ".parquet"), split="train", cache_dir=str(cache))
    if not decode:
        for name, feature in ds.features.items():
            if isinstance(feature, datasets.Image):
                ds = ds.cast_column(name, datasets.Image(decode=False))
    return ds


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """JPEGs in 3 classes, plus a PNG and a WebP (every extension is the bytes' own)."""
    root = write_image_folder(tmp_path_factory.mktemp("export") / "src", count=21, classes=3)
    rng = np.random.default_rng(3)
    Image.fromarray(natural_image(rng, 30, 40)).save(root / "class_1" / "lossless.png")
    Image.fromarray(natural_image(rng, 20, 28)).save(root / "class_2" / "small.webp", quality=80)
    return root


@pytest.fixture(scope="module")
def packs(src, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packs")
    outs = {}
    for fmt in ALL:
        outs[fmt] = out_path(root, fmt, fmt)
        options = {"samples_per_shard": 5} if fmt == "records" else {}
        packer.pack(src, outs[fmt], format=fmt, workers=0, **options)
    return outs


def stored(pack: Path) -> list[tuple[str, bytes, int]]:
    """(key, stored bytes, label) of every sample, through packer's own checked reader."""
    r = open_reader(pack)
    try:
        return [(r.keys[i], bytes(r.read(i).data), r.read(i).label) for i in range(len(r))]
    finally:
        r.close()


@pytest.mark.parametrize("fmt", ALL)
def test_webdataset_reads_every_sample_with_identical_bytes_and_labels(packs, tmp_path, fmt):
    out = tmp_path / "wds"
    report = packer.export(packs[fmt], out, to="wds", samples_per_shard=5)
    want = stored(packs[fmt])
    assert report.count == len(want) == 23 and report.failed == 0 and report.shards == 5
    got = read_wds(out)
    assert [unquote(s["__key__"]) for s in got] == [k for k, _, _ in want]
    ext = {"jpeg": "jpg", "png": "png", "webp": "webp"}
    for s, (key, data, label) in zip(got, want):
        name = ext[Image.open(io.BytesIO(data)).format.lower()]
        assert set(s) - {"__key__", "__url__", "__local_path__"} == {name, "cls"}, key
        assert s[name] == data and s["cls"] == label
    ds = packer.PackedDataset(packs[fmt], decode="numpy")
    for s, (image, label) in zip(read_wds(out, "rgb8"), ds):
        pixels = next(v for k, v in s.items() if not k.startswith("__") and k != "cls")
        assert np.array_equal(pixels, image) and s["cls"] == label


@pytest.mark.parametrize("fmt", ALL)
def test_datasets_reads_images_labels_and_class_names(packs, tmp_path, fmt):
    out = tmp_path / "pq"
    report = packer.export(packs[fmt], out, to="parquet", shard_size="10KB")
    want = stored(packs[fmt])
    assert report.count == len(want) and report.shards > 1
    ds = load_parquet(out, tmp_path / "hf")
    classes = open_reader(packs[fmt]).classes
    assert isinstance(ds.features["image"], datasets.Image)
    assert isinstance(ds.features["label"], datasets.ClassLabel) and ds.features["label"].names == classes
    assert ds["__key__"] == [k for k, _, _ in want] and ds["label"] == [lab for _, _, lab in want]
    reference = packer.PackedDataset(packs[fmt], decode="numpy")
    for row, (image, _) in zip(ds, reference):
        assert np.array_equal(np.asarray(row["image"].convert("RGB")), image)
    raw = load_parquet(out, tmp_path / "hf", decode=False)
    assert [row["image"]["bytes"] for row in raw] == [data for _, data, _ in want]
    assert [row["image"]["path"] for row in raw] == [k for k, _, _ in want]


def test_shards_have_the_size_asked_and_the_record_lists_them(packs, tmp_path):
    import hashlib

    want = stored(packs["lmdb"])
    sizes = [len(d) + 1 + 2048 for _, d, _ in want]  # the image and the label (1 digit), each with its header
    out = tmp_path / "wds"
    packer.export(packs["lmdb"], out, to="wds", shard_size=3 * max(sizes))
    record = load_export(out)
    assert [s["file"] for s in record["shards"]] == [f"shard-{i:06d}.tar" for i in range(len(record["shards"]))]
    assert sorted(p.name for p in out.iterdir()) == sorted([EXPORT_NAME, "failures.jsonl"]
                                                           + [s["file"] for s in record["shards"]])
    starts = [s["start"] for s in record["shards"]] + [len(want)]
    for shard, stop in zip(record["shards"], starts[1:]):
        data = (out / shard["file"]).read_bytes()
        assert len(data) == shard["bytes"] and hashlib.sha256(data).hexdigest() == shard["sha256"]
        assert shard["count"] == stop - shard["start"]
        # a shard ends before a sample would take it past the size (its members and their
        # headers; the tar's end-of-archive padding aside)
        assert sum(sizes[shard["start"]:stop]) <= 3 * max(sizes) and len(data) - 10240 <= 3 * max(sizes)
    assert sum(s["count"] for s in record["shards"]) == record["count"] == len(want)
    r = open_reader(packs["lmdb"])
    assert record["source"]["identity"] == r.manifest.identity() and record["source"]["format"] == "lmdb"
    assert record["source"]["checksum"] == json.loads((packs["lmdb"] / "packer.json").read_text())["checksum"]
    assert record["classes"] == r.classes and record["failures"] == 0


def test_samples_per_shard_and_shard_size_whichever_first(packs, tmp_path):
    out = tmp_path / "pq"
    report = packer.export(packs["hdf5"], out, to="parquet", samples_per_shard=4, shard_size="1GB")
    record = load_export(out)
    assert [s["count"] for s in record["shards"]] == [4, 4, 4, 4, 4, 3] and report.shards == 6
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(out / "shard-000000.parquet").schema_arrow.metadata
    assert json.loads(meta[b"huggingface"])["info"]["features"]["label"]["_type"] == "ClassLabel"
    assert json.loads(meta[b"packer"])["source"]["identity"] == record["source"]["identity"]


def test_a_raw_pixel_pack_is_exported_as_lossless_png(src, tmp_path):
    pack = tmp_path / "raw.h5"
    packer.pack(src, pack, format="hdf5", raw=True, resize=packer.ResizeSpec(size=(24, 16)), workers=0)
    packer.export(pack, tmp_path / "wds", to="wds")
    packer.export(pack, tmp_path / "pq", to="parquet")
    ds = packer.PackedDataset(pack, decode="numpy")
    got = read_wds(tmp_path / "wds", "rgb8")
    assert len(got) == len(ds) and all(set(s) >= {"png", "cls"} for s in got)
    for s, (image, label) in zip(got, ds):
        assert np.array_equal(s["png"], image) and s["cls"] == label
    for row, (image, _) in zip(load_parquet(tmp_path / "pq", tmp_path / "hf"), ds):
        assert np.array_equal(np.asarray(row["image"]), image)
    assert load_export(tmp_path / "wds")["images"] == "png from raw pixels"


# ----------------------------------------------------------------------------- field packs


@pytest.fixture(scope="module")
def coco_pack(tmp_path_factory) -> Path:
    pytest.importorskip("pycocotools")
    from tests.support.coco import make_coco

    root = tmp_path_factory.mktemp("coco")
    files = make_coco(root, n_images=6, captions=True)
    pack = root / "coco.lmdb"
    packer.pack(root, pack, coco=files["instances"], workers=0)
    return pack


@pytest.fixture(scope="module")
def caption_pack(tmp_path_factory) -> Path:
    """A sample manifest with a caption, a label, a score, tags, an embedding and an object;
    two rows share an image (so two samples share a key)."""
    root = tmp_path_factory.mktemp("captions")
    rng = np.random.default_rng(9)
    rows = []
    for i in range(7):
        name = f"pics/p.{i}.png" if i != 6 else "pics/p.0.png"
        if i != 6:
            (root / "pics").mkdir(exist_ok=True)
            Image.fromarray(natural_image(rng, 10 + i, 14)).save(root / name)
        rows.append({"image": name, "caption": f"caption {i} – ✓", "label": i % 3, "score": float(rng.normal()),
                     "tags": list(range(i % 3)), "embedding": [float(v) for v in rng.normal(size=i)],
                     "meta": {"i": i, "ok": True}})
    (root / "samples.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    pack = root / "captions.h5"
    packer.pack(root, pack, format="hdf5", manifest=root / "samples.jsonl", workers=0,
                schema={"image": "image", "caption": "str", "label": "int", "score": "float", "tags": "labels",
                        "embedding": "ndarray:float64:*", "meta": "json"})
    return pack


def field_values(pack: Path) -> tuple[list[str], list[dict]]:
    r = open_reader(pack)
    ds = packer.PackedDataset(pack, decode="bytes")
    return list(r.keys), [ds[i] for i in range(len(ds))]


def assert_same(value, want) -> None:
    if isinstance(want, np.ndarray):
        got = np.asarray(value, dtype=want.dtype).reshape(want.shape)
        assert np.array_equal(got, want) and (not isinstance(value, np.ndarray) or value.dtype == want.dtype)
    else:
        assert value == want


@pytest.mark.parametrize("pack_name", ["coco_pack", "caption_pack"])
def test_a_field_pack_through_webdataset(request, tmp_path, pack_name):
    pack = request.getfixturevalue(pack_name)
    keys, samples = field_values(pack)
    packer.export(pack, tmp_path / "wds", to="wds", samples_per_shard=4)
    schema = open_reader(pack).schema
    got = read_wds(tmp_path / "wds")
    assert len(got) == len(samples)
    for s, key, want in zip(got, keys, samples):
        assert unquote(s["__key__"].split("#")[0]) == key
        for f in schema.fields:
            member = [k for k in s if k.split(".")[0] == f.name.lower()]
            assert len(member) == 1, (f.name, sorted(s))
            value = s[member[0]]
            if f.type_name == "image":
                assert member[0] in (f"{f.name}.jpg", f"{f.name}.png") and value == want[f.name]
            elif f.type_name == "json":
                assert member[0].endswith(".json") and value == want[f.name]
            else:
                assert_same(value, want[f.name])


@pytest.mark.parametrize("pack_name", ["coco_pack", "caption_pack"])
def test_a_field_pack_through_datasets(request, tmp_path, pack_name):
    pack = request.getfixturevalue(pack_name)
    keys, samples = field_values(pack)
    packer.export(pack, tmp_path / "pq", to="parquet")
    schema = open_reader(pack).schema
    ds = load_parquet(tmp_path / "pq", tmp_path / "hf", decode=False)
    assert list(ds.features) == ["__key__"] + schema.names and ds["__key__"] == keys
    for row, want in zip(ds, samples):
        for f in schema.fields:
            if f.type_name == "image":
                assert row[f.name]["bytes"] == want[f.name]
            elif f.type_name == "json":
                assert json.loads(row[f.name]) == want[f.name]
            else:
                assert_same(row[f.name], want[f.name])


def test_repeated_and_dotted_keys_are_tar_safe_and_unique(caption_pack, tmp_path):
    packer.export(caption_pack, tmp_path / "wds", to="wds")
    got = [s["__key__"] for s in read_wds(tmp_path / "wds")]
    keys = list(open_reader(caption_pack).keys)
    assert keys[6] == keys[0] == "pics/p.0.png"
    assert got[0] == "pics/p%2E0%2Epng" and got[6] == "pics/p%2E0%2Epng#2" and len(set(got)) == len(got)
    assert [unquote(k.split("#")[0]) for k in got] == keys


@pytest.mark.parametrize("key", ["a.b/c.d.jpg", "__x__/y", "_a", "/lead", "trail/", "a//b", "..", "%2E", "a#1",
                                 "ü/ñ é.png", "tab\there", "back\\slash"])
def test_tar_key_reverses_and_splits_where_webdataset_splits(key):
    from webdataset.tariterators import base_plus_ext

    escaped = tar_key(key)
    assert unquote(escaped) == key and "." not in escaped and "#" not in escaped
    assert base_plus_ext(f"{escaped}.field.jpg") == (escaped, "field.jpg")
    assert not escaped.startswith("__") and "//" not in escaped and not escaped.startswith("/")


@given(st.text(min_size=1, max_size=40).filter(lambda k: not any(0xD800 <= ord(c) < 0xE000 for c in k)))
def test_any_key_escapes_reversibly_and_splits_where_webdataset_splits(key):
    from webdataset.tariterators import base_plus_ext

    escaped = tar_key(key)
    assert unquote(escaped) == key and "." not in escaped and "#" not in escaped
    assert base_plus_ext(f"{escaped}.jpg") == (escaped, "jpg") and not escaped.startswith(("__", "/"))
    assert escape_key(key) == escaped  # the fast path gives what the general escape gives


def test_fields_that_differ_only_in_case_are_refused(tmp_path):
    (tmp_path / "img").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "img" / "a.png")
    (tmp_path / "m.jsonl").write_text(json.dumps({"image": "img/a.png", "Caption": "x", "caption": "y"}) + "\n")
    pack = tmp_path / "p"
    packer.pack(tmp_path, pack, manifest=tmp_path / "m.jsonl", workers=0)
    with pytest.raises(UsageError, match="differ only in case"):
        packer.export(pack, tmp_path / "wds", to="wds")
    assert not (tmp_path / "wds").exists() and not (tmp_path / "wds.partial").exists()


# ----------------------------------------------------------------------------- refusals


def test_a_frames_pack_is_refused_naming_what_it_holds(tmp_path):
    from tests.support.inputs import write_video_folder

    pack = tmp_path / "frames.lmdb"
    packer.decode_frames(write_video_folder(tmp_path / "videos", per_class=1, classes=1, frames=6), pack,
                         to="lmdb", workers=0)
    with pytest.raises(UsageError, match="holds frames .a decode-frames output.; export takes image packs"):
        packer.export(pack, tmp_path / "wds", to="wds")
    assert not (tmp_path / "wds").exists() and not (tmp_path / "wds.partial").exists()


def test_an_output_overlapping_the_pack_is_refused(packs, tmp_path):
    pack = tmp_path / "copy"
    shutil.copytree(packs["lmdb"], pack)
    for out in (pack / "inside", pack, tmp_path):
        with pytest.raises(UsageError, match="refusing an output that"):
            packer.export(pack, out, to="wds", overwrite=True)
    assert not (pack / "inside").exists() and open_reader(pack).manifest.count == 23
    h5 = packs["hdf5"]
    with pytest.raises(UsageError, match="refusing an output that"):
        packer.export(h5, h5.parent, to="parquet", overwrite=True)


def test_overwrite_replaces_only_an_export_or_a_pack(packs, tmp_path):
    out = tmp_path / "wds"
    packer.export(packs["lmdb"], out, to="wds")
    with pytest.raises(UsageError, match="already exists"):
        packer.export(packs["lmdb"], out, to="parquet")
    report = packer.export(packs["hdf5"], out, to="parquet", overwrite=True)
    assert load_export(out)["format"] == "parquet" and report.count == 23 and not shards(out, ".tar")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not a packer output"):
        packer.export(packs["lmdb"], foreign, to="wds", overwrite=True)
    assert (foreign / "notes.txt").read_text() == "keep me"
    with pytest.raises(UsageError, match="exclude each other"):
        packer.export(packs["lmdb"], out, to="wds", overwrite=True, resume=True)


def test_arguments_are_checked_before_any_work(packs, tmp_path):
    for kwargs, match in (({"to": "tar"}, "to must be one of wds, parquet"),
                          ({"to": "wds", "shard_size": "lots"}, "bad size"),
                          ({"to": "wds", "samples_per_shard": 0}, "samples_per_shard must be >= 1"),
                          ({"to": "wds", "max_failures": -1}, "max_failures must be >= 0")):
        with pytest.raises(UsageError, match=match):
            packer.export(packs["lmdb"], tmp_path / "x", **kwargs)
    with pytest.raises(UsageError, match="must be a local path"):
        packer.export(packs["lmdb"], "s3://bucket/x", to="wds")
    assert not list(tmp_path.iterdir())


def test_a_finished_export_resumed_is_checked_and_kept(packs, tmp_path):
    out = tmp_path / "wds"
    packer.export(packs["lmdb"], out, to="wds", samples_per_shard=10)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    report = packer.export(packs["lmdb"], out, to="wds", samples_per_shard=10, resume=True)
    assert report.status == "complete" and "complete and verified" in report.summary()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(ResumeRefused, match="samples_per_shard: 10 -> 7"):
        packer.export(packs["lmdb"], out, to="wds", samples_per_shard=7, resume=True)
    with pytest.raises(ResumeRefused, match="source pack: identity"):
        packer.export(packs["hdf5"], out, to="wds", samples_per_shard=10, resume=True)
    shard = out / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[2000] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptData, match="shard-000001.tar"):
        packer.export(packs["lmdb"], out, to="wds", samples_per_shard=10, resume=True)
    record = json.loads((out / EXPORT_NAME).read_text())
    record["count"] += 1
    (out / EXPORT_NAME).write_text(json.dumps(record))
    with pytest.raises(CorruptData, match="checksum mismatch"):
        load_export(out)


def test_missing_pyarrow_is_a_usage_error_naming_the_extra(packs, tmp_path):
    code = ("import sys; sys.modules['pyarrow'] = None\n"
            "import packer\n"
            "from packer.errors import UsageError\n"
            "try:\n"
            f"    packer.export({str(packs['lmdb'])!r}, {str(tmp_path / 'pq')!r}, to='parquet')\n"
            "except UsageError as e:\n"
            "    print('refused:', e)\n"
            f"r = packer.export({str(packs['lmdb'])!r}, {str(tmp_path / 'wds')!r}, to='wds')\n"
            "print(r.count)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert "refused: exporting to Parquet needs pyarrow: pip install 'packer[export]'" in done.stdout
    assert done.stdout.strip().endswith("23")  # tar shards need no extra
    assert not (tmp_path / "pq").exists() and not (tmp_path / "pq.partial").exists()
