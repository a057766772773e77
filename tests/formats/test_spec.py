"""Formats describe themselves: each registered package's FORMAT agrees with its classes, and
what remote/ and the CLI derive from the specs is what they hard-coded before."""
from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from packer.formats import TABLES, FormatSpec, format_spec, format_specs, open_reader, single_file_spec
from tests.support.inputs import write_image_folder

ALL = [name for table in TABLES for name in table]


@pytest.mark.parametrize("name", ALL)
def test_spec_agrees_with_its_classes(name):
    table = next(t for t in TABLES if name in t)
    spec = table.spec(name)
    writer_cls, reader_cls = table[name]
    assert spec.name == writer_cls.format_name == reader_cls.format_name == name
    assert writer_cls.single_file == spec.single_file
    assert format_spec(name) is spec


def test_single_files_are_known_by_their_ending():
    assert single_file_spec("out.H5").name == "hdf5"
    assert single_file_spec("train.hdf5") is not None and single_file_spec("train.lmdb") is None
    assert single_file_spec("") is None


def test_a_spec_refuses_what_cannot_be():
    with pytest.raises(ValueError):
        FormatSpec(name="x", writer="m:W", reader="m:R", fetch="ftp")
    with pytest.raises(ValueError):  # fetching one file is what a single-file format does
        FormatSpec(name="x", writer="m:W", reader="m:R", fetch="file")


def test_the_cache_keeps_every_sidecar_a_remote_format_declares():
    from packer.remote.cache import _is_metadata

    kept = ["packer.json", "packer.sha256", "keys.json", "checksums.bin", "failures.jsonl",
            "train-00000.tfrecord.idx", "a.h5.failures.jsonl", "a.h5.sha256"]
    assert all(_is_metadata(Path(n)) for n in kept)
    assert not any(_is_metadata(Path(n)) for n in ["data.mdb", "train-00000.tfrecord", "a.h5"])
    assert {s.fetch for s in format_specs()} == {"whole", "shards", "file", None}


def test_a_format_without_a_command_of_its_own_gets_to_name(tmp_path):
    from packer.cli.images import format_command

    group = click.Group()
    format_command(group, "lmdb")  # as a newly registered format would get it
    src = write_image_folder(tmp_path / "src", count=6)
    result = CliRunner().invoke(group, ["to-lmdb", str(src), str(tmp_path / "out"), "--workers", "0"])
    assert result.exit_code == 0, result.output
    assert len(open_reader(tmp_path / "out")) == 6
