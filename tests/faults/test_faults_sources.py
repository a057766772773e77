"""Dataset sources under bad input: every damaged tar member, incomplete or ambiguous sample,
null Parquet cell, damaged Parquet page or Arrow stream is a recorded failure (or a clear error)
naming the shard or file and the key, and every other sample is packed exactly as from an
undamaged source."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

import packer
from packer.formats import open_reader
from tests.support.inputs import write_image_folder
from tests.support.sources import write_hf, write_shards

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("webdataset")
pytest.importorskip("datasets")

COUNT = 12


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("tree") / "train", count=COUNT, classes=3)


def _stored(out: Path) -> dict[str, bytes]:
    """key -> stored bytes of a packed output (field packs: the blob)."""
    r = open_reader(out)
    return {k: r.read(i).data for i, k in enumerate(r.keys)}


def _pack(src, out: Path) -> tuple[dict[str, bytes], list[dict]]:
    report = packer.pack(src, out, workers=0, max_failures=COUNT)
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert report.count == len(open_reader(out))
    return _stored(out), failures


# -- tar shards ----------------------------------------------------------------------------------------
def _members(shard: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(shard) as t:
        return t.getmembers()


def _nth(shard: Path, suffix: str, n: int) -> tarfile.TarInfo:
    """The ``n``-th member of ``shard`` whose name ends in ``suffix`` (TarWriter writes a
    sample's members sorted by extension: ``.cls`` before ``.jpg``)."""
    return [m for m in _members(shard) if m.name.endswith(suffix)][n]


def _rewrite(shard: Path, edit) -> None:
    """Rewrite ``shard`` member by member through ``edit(info, data) -> [(info, data), ...]``."""
    with tarfile.open(shard) as t:
        members = [(m, t.extractfile(m).read() if m.isreg() else None) for m in t.getmembers()]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for m, data in members:
            for info, content in edit(m, data):
                t.addfile(info, io.BytesIO(content) if content is not None else None)
    shard.write_bytes(buf.getvalue())


def _truncate(shards: list[Path]) -> tuple[str, list[str]]:
    """Cut the second shard inside its last member's data."""
    last = _members(shards[1])[-1]
    raw = shards[1].read_bytes()
    shards[1].write_bytes(raw[:last.offset_data + last.size // 2])
    key, _ = last.name.rsplit(".", 1)
    return "shard-000001.tar", [f"{key}.jpg"]


def _no_image(shards: list[Path]) -> tuple[str, list[str]]:
    drop = _nth(shards[0], ".jpg", 1).name
    _rewrite(shards[0], lambda m, d: [] if m.name == drop else [(m, d)])
    return "shard-000000.tar", [drop.rsplit(".", 1)[0]]


def _duplicate(shards: list[Path]) -> tuple[str, list[str]]:
    twice = _nth(shards[0], ".jpg", 2).name
    _rewrite(shards[0], lambda m, d: [(m, d), (m, d)] if m.name == twice else [(m, d)])
    return "shard-000000.tar", [twice]


def _bad_header(shards: list[Path]) -> tuple[str, list[str]]:
    """A flipped bit in a header of the middle of the first shard: the members after it are
    unlisted (one failure naming the shard and the offset), the samples before it packed."""
    m = _nth(shards[0], ".cls", 3)
    raw = bytearray(shards[0].read_bytes())
    raw[m.offset + 2] ^= 0x01
    shards[0].write_bytes(bytes(raw))
    return "shard-000000.tar", ["offset"]


def _link(shards: list[Path]) -> tuple[str, list[str]]:
    target = _nth(shards[0], ".jpg", 0).name
    link = _nth(shards[0], ".jpg", 1).name

    def edit(m, d):
        if m.name != link:
            return [(m, d)]
        info = tarfile.TarInfo(link)
        info.type, info.linkname = tarfile.SYMTYPE, target
        return [(info, None)]

    _rewrite(shards[0], edit)
    return "shard-000000.tar", [link]


def _bad_cls(shards: list[Path]) -> tuple[str, list[str]]:
    cls = _nth(shards[1], ".cls", 1).name

    def edit(m, d):
        if m.name != cls:
            return [(m, d)]
        m.size = 3
        return [(m, b"one")]

    _rewrite(shards[1], edit)
    return "shard-000001.tar", [cls.rsplit(".", 1)[0] + ".jpg"]


def _unsafe_name(shards: list[Path]) -> tuple[str, list[str]]:
    first = _members(shards[0])[:2]

    def edit(m, d):
        if m not in first and m.name not in [f.name for f in first]:
            return [(m, d)]
        m.name = "../escape/" + m.name
        return [(m, d)]

    _rewrite(shards[0], edit)
    return "shard-000000.tar", ["../escape/"]


def _not_a_tar(shards: list[Path]) -> tuple[str, list[str]]:
    shards[1].write_bytes(b"this is not a tar file\n" * 100)
    return "shard-000001.tar", ["offset 0"]


TAR_FAULTS = {"truncated member": _truncate, "sample missing its image": _no_image,
              "two members with the same key and extension": _duplicate, "damaged header": _bad_header,
              "a link member": _link, "a .cls that is not an integer": _bad_cls, "an unsafe member name": _unsafe_name,
              "a shard that is not a tar": _not_a_tar}


@pytest.mark.parametrize("fault", list(TAR_FAULTS))
def test_a_bad_tar_sample_is_a_recorded_failure_naming_shard_and_key(tree, tmp_path, fault):
    good = write_shards(tree, tmp_path / "good", per_shard=6, cls=True)
    ref, _ = _pack(tmp_path / "good", tmp_path / "ref")
    bad = write_shards(tree, tmp_path / "bad", per_shard=6, cls=True)
    assert [s.name for s in good] == [s.name for s in bad] == ["shard-000000.tar", "shard-000001.tar"]
    shard, names = TAR_FAULTS[fault](bad)
    got, failures = _pack(tmp_path / "bad", tmp_path / "out")
    assert failures, fault
    for f in failures:  # each names the shard, and the sample's key (or where the damage is)
        assert f["source"].endswith(shard) and f["stage"] in ("input", "read")
        assert any(n in f["key"] or n in f["reason"] for n in names), f
    assert got.items() <= ref.items()  # every sample packed is the one the good shards give
    lost = set(ref) - set(got)
    if fault in ("damaged header", "truncated member", "a shard that is not a tar"):
        # the members past the damage cannot be listed: only samples of the damaged shard are missing
        assert all(k in _shard_keys(good[int(shard[-5])]) for k in lost)
    else:
        stems = {k.rsplit(".", 1)[0] for k in lost}  # (a sample without an image is named by its key)
        assert len(lost) == len(failures) and {f["key"].removeprefix("../escape/").rsplit(".", 1)[0]
                                               for f in failures} == stems


def _shard_keys(shard: Path) -> set[str]:
    return {m.name for m in _members(shard) if m.name.endswith(".jpg")}


# -- Parquet and Arrow -----------------------------------------------------------------------------
def _parquet(tree: Path, tmp_path: Path, *, checksums: bool = True) -> Path:
    """The dataset as a Parquet file of row groups of 4 rows (HF metadata kept), pages with checksums."""
    src = write_hf(tree, tmp_path / "hf.parquet", parquet=True)
    table = pq.read_table(src)
    out = tmp_path / "data.parquet"
    # (no statistics: a page header's min and max would hold copies of whole images)
    pq.write_table(table, out, row_group_size=4, write_page_checksum=checksums, compression="none",
                   write_statistics=False)
    return out


def _column_chunk(path: Path, group: int, column: str) -> tuple[int, int]:
    meta = pq.ParquetFile(path).metadata
    rg = meta.row_group(group)
    for j in range(rg.num_columns):
        c = rg.column(j)
        if c.path_in_schema == column:
            start = c.dictionary_page_offset or c.data_page_offset
            return start, c.total_compressed_size
    raise KeyError(column)


def test_a_null_image_is_a_recorded_failure_naming_file_and_row(tree, tmp_path):
    path = _parquet(tree, tmp_path)
    table = pq.read_table(path)
    images = table.column("image").combine_chunks()
    rows = images.to_pylist()
    rows[5] = {"bytes": None, "path": None}
    table = table.set_column(0, "image", pa.array(rows, type=images.type))
    pq.write_table(table, path, row_group_size=4)
    (tmp_path / "ok").mkdir()
    ref, _ = _pack(_parquet(tree, tmp_path / "ok"), tmp_path / "ref")
    got, failures = _pack(path, tmp_path / "out")
    assert [(f["key"], f["source"], f["stage"]) for f in failures] == [("00000005", str(path), "read")]
    assert "row 5: column 'image' is null" in failures[0]["reason"]
    assert set(ref) - set(got) == {"00000005"} and got.items() <= ref.items()


@pytest.mark.parametrize("damage", ["a flipped bit in a page (page checksums)", "a damaged page header"])
def test_a_damaged_parquet_page_fails_its_rows_only(tree, tmp_path, damage):
    (tmp_path / "ok").mkdir()
    ref, _ = _pack(_parquet(tree, tmp_path / "ok"), tmp_path / "ref")
    path = _parquet(tree, tmp_path, checksums=damage.endswith("checksums)"))
    start, size = _column_chunk(path, 1, "image.bytes")  # rows 4..7
    raw = bytearray(path.read_bytes())
    if damage.endswith("checksums)"):
        image = pq.read_table(path).column("image")[5].as_py()["bytes"]
        assert raw.count(image) == 1 and start <= raw.index(image) < start + size
        raw[raw.index(image) + len(image) // 2] ^= 0x08  # inside row 5's image, in its page's data
    else:
        raw[start:start + 6] = b"\xff" * 6  # the thrift page header: not a header any more
    path.write_bytes(bytes(raw))
    got, failures = _pack(path, tmp_path / "out")
    assert [f["key"] for f in failures] == [f"{i:08d}" for i in range(4, 8)]
    assert all(f["source"] == str(path) and f"row {int(f['key'])}: row group 1 " in f["reason"] for f in failures)
    assert set(ref) - set(got) == {f"{i:08d}" for i in range(4, 8)} and got.items() <= ref.items()


def test_a_file_that_is_not_parquet_is_one_failure_the_others_packed(tree, tmp_path):
    src = write_hf(tree, tmp_path / "hf.parquet", parquet=True)
    table = pq.read_table(src)
    (tmp_path / "parts").mkdir()
    for k in range(3):
        pq.write_table(table.slice(4 * k, 4), tmp_path / "parts" / f"p-{k}.parquet")
    (tmp_path / "parts" / "p-1.parquet").write_bytes(b"PAR1 not really")
    report = packer.pack(tmp_path / "parts", tmp_path / "out", workers=0, max_failures=1)
    assert report.count == 8 and len(report.failures) == 1
    f = report.failures[0]
    assert f["source"].endswith("p-1.parquet") and "cannot read this parquet file" in f["reason"]


def test_a_truncated_arrow_file_keeps_the_batches_before_the_damage(tree, tmp_path):
    src = write_hf(tree, tmp_path / "hf")
    ds = __import__("datasets").load_from_disk(str(src))
    small = tmp_path / "small"
    ds.save_to_disk(str(small), max_shard_size="1MB")
    arrow = next(small.glob("*.arrow"))
    # rewrite with batches of 5 rows (save_to_disk writes 100-row batches for images)
    with pa.OSFile(str(arrow)) as f:  # read into memory, not mapped: the file is rewritten below
        table = pa.ipc.open_stream(f).read_all()
    with pa.OSFile(str(arrow), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        for batch in table.to_batches(max_chunksize=5):
            w.write_batch(batch)
    arrow.write_bytes(arrow.read_bytes()[:-300])  # the last batch cut short
    report = packer.pack(small, tmp_path / "out", workers=0, max_failures=1)
    assert report.count == 10 and len(report.failures) == 1
    assert report.failures[0]["source"] == str(arrow) and "Arrow stream is damaged" in report.failures[0]["reason"]


def test_a_null_caption_fails_its_row(tree, tmp_path):
    src = write_hf(tree, tmp_path / "hf.parquet", parquet=True)
    table = pq.read_table(src)
    captions = table.column("caption").to_pylist()
    captions[3] = None
    pq.write_table(table.set_column(2, "caption", pa.array(captions, pa.string())), src)
    report = packer.pack(src, tmp_path / "out", workers=0, max_failures=1)
    assert report.count == COUNT - 1
    assert [(f["key"], f["reason"]) for f in report.failures] == [("00000003", "row 3: column 'caption' is null")]
