"""LMDB specifics: the Caffe Datum layout DALI reads, checksums, map growth, corruption."""
from __future__ import annotations

import json
import shutil

import lmdb
import numpy as np
import pytest

from packer.errors import CorruptData
from packer.formats.sample import Sample
from packer.formats.lmdb import LmdbReader, LmdbWriter, lmdb_key
from packer.commands.inspection import verify_dataset
from packer.integrity import crc32c
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions
from tests.support.protobuf import Datum


@pytest.fixture
def packed(image_folder, tmp_path):
    out = tmp_path / "ds.lmdb"
    pack_images(image_folder, out, format="lmdb", run_options=RunOptions(workers=0))
    return out


def test_layout_is_caffe_datum_and_only_samples(packed, image_folder):
    env = lmdb.open(str(packed), readonly=True, lock=False)
    with env.begin() as txn:
        keys = [k for k, _ in txn.cursor()]
        first = txn.get(b"00000000")
    env.close()
    assert keys == [lmdb_key(i) for i in range(len(keys))]  # no other keys in the main db
    d = Datum()
    d.ParseFromString(first)
    names = json.loads((packed / "keys.json").read_text())
    assert d.encoded and d.data == (image_folder / names[0]).read_bytes()
    assert (d.channels, d.label) == (3, 0) and d.height > 0 and d.width > 0
    m = json.loads((packed / "packer.json").read_text())
    assert m["format"] == "lmdb" and m["format_version"] == 1 and m["count"] == len(keys)
    assert m["classes"] == ["class_0", "class_1", "class_2"]
    assert "packer" in m["created_by"] and m["created_by"]["options"]["check"] == "full"
    crcs = np.frombuffer((packed / "checksums.bin").read_bytes(), "<u4")
    assert int(crcs[0]) == crc32c(first)


def test_map_grows_on_mapfull(tmp_path, monkeypatch):
    monkeypatch.setattr("packer.formats.lmdb.writer._INITIAL_MAP", 1 << 16)
    out = tmp_path / "grow"
    blob = np.random.default_rng(0).bytes(40_000)
    with LmdbWriter(out, classes=["a"], commit_every=7) as w:
        for i in range(30):
            w.add(Sample(f"k{i}", blob, "raw", 0, 100, 100, 4))
        w.close()
    r = LmdbReader(out)
    assert len(r) == 30 and r.read(29).data == blob


def test_flipped_byte_is_caught_by_crc(packed, tmp_path):
    bad = tmp_path / "bad.lmdb"
    shutil.copytree(packed, bad)
    env = lmdb.open(str(bad), map_size=1 << 30)
    with env.begin(write=True) as txn:
        v = bytearray(txn.get(lmdb_key(5)))
        v[len(v) // 2] ^= 0x40
        txn.put(lmdb_key(5), bytes(v))
    env.close()
    r = LmdbReader(bad)
    with pytest.raises(CorruptData, match="sample 5.*CRC32C mismatch"):
        r.read(5)
    result = verify_dataset(bad)
    assert not result.ok and any("sample 5" in p for p in result.problems)
    assert len(result.problems) == 1


def test_missing_key_reported(packed, tmp_path):
    bad = tmp_path / "bad.lmdb"
    shutil.copytree(packed, bad)
    env = lmdb.open(str(bad), map_size=1 << 30)
    with env.begin(write=True) as txn:
        txn.delete(lmdb_key(3))
    env.close()
    with pytest.raises(CorruptData, match="missing key"):
        LmdbReader(bad).read(3)
    problems = verify_dataset(bad).problems
    assert any("missing key" in p and "sample 3" in p for p in problems)
    assert any("entries" in p for p in problems)


def test_unknown_version_is_clear(packed, tmp_path):
    bad = tmp_path / "v.lmdb"
    shutil.copytree(packed, bad)
    m = json.loads((bad / "packer.json").read_text())
    m["format_version"] = 99
    (bad / "packer.json").write_text(json.dumps(m))
    from packer.errors import FormatError

    with pytest.raises(FormatError, match="unknown format_version 99"):
        LmdbReader(bad)


def test_deleted_output_releases_its_cached_environment(image_folder, tmp_path):
    """A cached read-only environment of a deleted output is closed when another output is
    opened: py-lmdb keys open environments by inode, and a new output given the deleted one's
    inode number would otherwise be refused as 'already open' (seen in the corruption suite)."""
    from packer.formats.lmdb import env as lmdb_env

    gone, other = tmp_path / "gone.lmdb", tmp_path / "other.lmdb"
    pack_images(image_folder, gone, format="lmdb", run_options=RunOptions(workers=0))
    pack_images(image_folder, other, format="lmdb", run_options=RunOptions(workers=0))
    LmdbReader(gone).read(0)
    assert str(gone) in {path for path, _ in lmdb_env._ENVS}
    shutil.rmtree(gone)
    LmdbReader(other).read(0)
    cached = {path for path, _ in lmdb_env._ENVS}
    assert str(gone) not in cached and str(other) in cached


def test_keys_are_checked_by_the_files_own_crc_or_encoded_again(packed):
    """read_keys gives the CRC32C of keys.json's bytes, the manifest's keys checksum when the file
    is the keys as written; the same keys written otherwise (another JSON spacing) still check,
    encoded again; other keys do not."""
    from packer.formats.sidecars import keys_checksum, read_keys

    names = json.loads((packed / "keys.json").read_text())
    keys, crc = read_keys(packed, len(names))
    assert keys == names and crc == keys_checksum(names) == LmdbReader(packed).manifest.integrity["keys"]
    assert read_keys(packed, len(names) - 1, grown=True) == (names[:-1], None)
    (packed / "keys.json").write_text(json.dumps(names, indent=1))
    r = LmdbReader(packed)
    assert list(r.keys) == names and r._keys_file_crc != r.manifest.integrity["keys"]
    (packed / "keys.json").write_text(json.dumps([names[1], names[0], *names[2:]]))
    with pytest.raises(CorruptData, match="keys checksum mismatch"):
        LmdbReader(packed).keys


@pytest.mark.parametrize("fmt", ["jpeg", "raw", "blob"])
def test_prepare_pieces_join_to_the_prepared_value(fmt):
    """The shared-memory plan writes ``prepare_pieces`` one after the other: joined, they are
    ``prepare``'s value, with its CRC32C (a field pack's blob: no pieces, ``prepare`` itself)."""
    from packer.codecs.fields import BLOB_FMT
    from packer.formats.lmdb.writer import LmdbWriter
    from packer.formats.sample import Sample

    data = bytes(range(256)) * 40
    sample = Sample("k", data, BLOB_FMT if fmt == "blob" else fmt, 7, 30, 40, 3)
    got = LmdbWriter.prepare_pieces(sample)
    if fmt == "blob":
        assert got is None
        return
    pieces, at, crc = got
    assert (b"".join(pieces), crc) == LmdbWriter.prepare(sample) and pieces[at] == data
