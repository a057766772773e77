"""WebDataset tar shards: the header scanner lists what ``tarfile`` lists (ustar, GNU and pax
archives, long names, folders, links), samples are grouped and keyed as webdataset groups them,
and patterns expand as webdataset expands them."""
from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.conversion.inputs import parse_exts
from packer.conversion.shards import expand_shards, scan_shard, shard_items, split_name
from packer.errors import UsageError

wds = pytest.importorskip("webdataset")

_NAME = st.text(st.sampled_from("abcxyz0189_-. é"), min_size=1, max_size=12).filter(
    lambda s: s.strip(". ") == s and s not in (".", ".."))


def _tar(members: list[tuple[str, bytes | None]], fmt: int) -> bytes:
    """A tar (``tarfile`` in format ``fmt``) of ``(name, data)`` members (None: a folder)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _listed(raw: bytes) -> list[tuple[str, int, int, str]]:
    return [(m.name, m.offset, m.size, m.kind) for m in scan_shard(io.BytesIO(raw), len(raw))]


def _tarfile_listed(raw: bytes) -> list[tuple[str, int, int, str]]:
    with tarfile.open(fileobj=io.BytesIO(raw)) as t:
        return [(m.name, m.offset_data, m.size if m.isreg() else 0, "file" if m.isreg() else "dir")
                for m in t.getmembers()]


@settings(max_examples=60)
@given(members=st.lists(st.tuples(st.lists(_NAME, min_size=1, max_size=14).map("/".join),
                                  st.one_of(st.none(), st.binary(max_size=1500))), max_size=8),
       fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
def test_the_scanner_lists_what_tarfile_lists(members, fmt):
    try:
        raw = _tar(members, fmt)
    except ValueError:  # a name too long for ustar: tarfile refuses to write it
        return
    assert _listed(raw) == _tarfile_listed(raw)


def test_long_names_links_and_big_members_are_listed(tmp_path):
    buf = io.BytesIO()
    long = "d" * 120 + "/" + "n" * 130 + ".jpg"
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        info = tarfile.TarInfo(long)
        info.size = 3 << 20  # past one read window
        t.addfile(info, io.BytesIO(b"\x01" * info.size))
        link = tarfile.TarInfo("a/1.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, long
        t.addfile(link)
        small = tarfile.TarInfo("a/2.jpg")
        small.size = 5
        t.addfile(small, io.BytesIO(b"hello"))
    raw = buf.getvalue()
    got = _listed(raw)
    assert [g[0] for g in got] == [long, "a/1.jpg", "a/2.jpg"]
    assert got[1][3] == "a symbolic link" and got[2][1:3] == (_tarfile_listed(raw)[2][1], 5)
    assert raw[got[2][1]:got[2][1] + 5] == b"hello"


def test_damage_ends_the_listing_with_a_problem_naming_the_offset():
    raw = bytearray(_tar([("a/1.jpg", b"x" * 700), ("a/2.jpg", b"y" * 10)], tarfile.USTAR_FORMAT))
    second = 512 + 1024  # the second header: after the first's header and two data blocks
    raw[second + 3] ^= 0x20  # a flipped bit in its name: the checksum no longer matches
    got = list(scan_shard(io.BytesIO(bytes(raw)), len(raw)))
    assert [m.name for m in got][:1] == ["a/1.jpg"]
    assert "offset 1536" in got[-1].problem and "checksum" in got[-1].problem


def test_a_truncated_member_is_reported():
    raw = _tar([("a/1.jpg", b"x" * 700), ("a/2.jpg", b"y" * 2000)], tarfile.USTAR_FORMAT)
    cut = raw[:512 + 1024 + 512 + 1000]
    got = list(scan_shard(io.BytesIO(cut), len(cut)))
    assert got[-1].name == "a/2.jpg" and got[-1].problem.startswith("truncated: the shard ends 1000 bytes into its 2000")


def test_data_after_the_end_marker_is_reported():
    raw = _tar([("a/1.jpg", b"x")], tarfile.USTAR_FORMAT) + _tar([("a/2.jpg", b"y")], tarfile.USTAR_FORMAT)
    got = list(scan_shard(io.BytesIO(raw), len(raw)))
    assert got[0].name == "a/1.jpg" and "after the end-of-archive marker" in got[-1].problem


@given(st.text(st.sampled_from("ab./c"), max_size=10))
def test_names_split_as_webdataset_splits_them(name):
    from webdataset.tariterators import base_plus_ext

    assert split_name(name) == base_plus_ext(name)


def test_samples_match_what_webdataset_reads(tmp_path):
    from tests.support.inputs import write_image_folder
    from tests.support.sources import write_shards

    shards = write_shards(write_image_folder(tmp_path / "tree", count=12), tmp_path / "wds", per_shard=5,
                          cls=True, extra=True)
    listing = shard_items(tmp_path / "wds", exts=parse_exts(None), failures=[])
    assert listing.schema.names == ["image", "label", "json", "npy", "txt"]
    theirs = list(wds.WebDataset([str(s) for s in shards], shardshuffle=False))
    assert [it.key for it in listing.items] == [f"{s['__key__']}.jpg" for s in theirs]
    for it, s in zip(listing.items, theirs):
        values, _ = it.read_values()
        assert values["image"] == s["jpg"] and values["label"] == int(s["cls"]) and values["txt"] == s["txt"].decode()
        assert (values["npy"] == __import__("numpy").load(io.BytesIO(s["npy"]))).all()


def test_patterns_expand_as_webdataset_expands_them(tmp_path):
    for i in range(3):
        (tmp_path / f"s-{i:03d}.tar").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("x")
    brace = str(tmp_path / "s-{000..002}.tar")
    assert expand_shards(brace) == list(wds.shardlists.expand_urls(brace))
    assert expand_shards(tmp_path) == [str(tmp_path / f"s-{i:03d}.tar") for i in range(3)]
    assert expand_shards(str(tmp_path / "s-*.tar")) == expand_shards(tmp_path)


def test_a_pattern_naming_nothing_is_refused(tmp_path):
    with pytest.raises(UsageError, match="names no .tar shards"):
        shard_items(str(tmp_path / "none-*.tar"), exts=parse_exts(None), failures=[])


def test_a_missing_shard_of_a_pattern_is_recorded(tmp_path):
    from tests.support.inputs import write_image_folder
    from tests.support.sources import write_shards

    write_shards(write_image_folder(tmp_path / "tree", count=6), tmp_path / "wds", per_shard=3, cls=True)
    bad = []
    listing = shard_items(str(tmp_path / "wds" / "shard-{000000..000002}.tar"), exts=parse_exts(None), failures=bad)
    assert len(listing.items) == 6
    assert [(f.file, f.reason.split(" (")[0]) for f in bad] == [
        (str(tmp_path / "wds" / "shard-000002.tar"), "no such shard")]
    assert os.path.basename(bad[0].file) == "shard-000002.tar"


def test_items_hold_no_bytes(tmp_path):
    from tests.support.inputs import write_image_folder
    from tests.support.sources import write_shards

    write_shards(write_image_folder(tmp_path / "tree", count=4), tmp_path / "wds", cls=True, extra=True)
    for it in shard_items(tmp_path / "wds", exts=parse_exts(None), failures=[]).items:
        assert all(isinstance(v, (str, int)) for triple in it.members for v in triple)
        assert it.values is None and isinstance(Path(it.path), Path)
