"""``packer export``: the same as one ``packer.export`` call; usage errors are one line, exit 2;
a damaged sample makes exit status 1 (after publishing) unless ``--max-failures`` allows it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.formats import open_reader
from tests.support.inputs import write_image_folder

pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli-export")
    out = root / "p.lmdb"
    packer.pack(write_image_folder(root / "src", count=12, classes=2), out, workers=0)
    return out


def files(out: Path) -> dict[str, bytes]:
    """The export's files; ``export.json`` without ``created_by`` (it holds the command line)."""
    got = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    record = json.loads(got.pop("export.json"))
    record.pop("created_by")
    record.pop("checksum")
    return {**got, "export.json": json.dumps(record, sort_keys=True).encode()}


@pytest.mark.parametrize("to", ["wds", "parquet"])
def test_the_command_is_the_library_call(pack, tmp_path, to):
    r = CliRunner().invoke(main, ["export", str(pack), str(tmp_path / "cli"), "--to", to,
                                  "--samples-per-shard", "5", "--shard-size", "1MB"])
    assert r.exit_code == 0, r.output
    assert f"12 of 12 samples exported to 3 {to} shards, 0 failed" in r.output
    packer.export(pack, tmp_path / "lib", to=to, samples_per_shard=5, shard_size="1MB")
    assert files(tmp_path / "cli") == files(tmp_path / "lib")
    r = CliRunner().invoke(main, ["export", str(pack), str(tmp_path / "cli"), "--to", to, "--samples-per-shard",
                                  "5", "--shard-size", "1MB", "--resume"])
    assert r.exit_code == 0 and "complete and verified" in r.output, r.output


@pytest.mark.parametrize("args, message", [
    ([], "Missing option '--to'"),
    (["--to", "zip"], "'zip' is not one of 'wds', 'parquet'"),
    (["--to", "wds", "--shard-size", "big"], "bad size 'big'"),
    (["--to", "wds", "--samples-per-shard", "0"], "0 is not in the range x>=1"),
])
def test_usage_errors_are_one_line(pack, tmp_path, args, message):
    r = CliRunner().invoke(main, ["export", str(pack), str(tmp_path / "o"), *args])
    assert r.exit_code != 0 and message in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_an_existing_output_and_an_overlap_are_refused(pack, tmp_path):
    out = tmp_path / "o"
    assert CliRunner().invoke(main, ["export", str(pack), str(out), "--to", "wds"]).exit_code == 0
    r = CliRunner().invoke(main, ["export", str(pack), str(out), "--to", "wds"])
    assert r.exit_code == 1 and "already exists (use --overwrite" in r.output
    r = CliRunner().invoke(main, ["export", str(pack), str(out), "--to", "parquet", "--overwrite"])
    assert r.exit_code == 0 and (out / "shard-000000.parquet").exists()
    r = CliRunner().invoke(main, ["export", str(pack), str(pack / "exported"), "--to", "wds"])
    assert r.exit_code == 1 and "refusing an output that lies inside the input" in r.output
    r = CliRunner().invoke(main, ["export", str(pack), str(out), "--to", "wds", "--resume"])
    assert r.exit_code == 2 and "is complete but was made differently" in r.output


def test_a_damaged_sample_exits_1_unless_allowed(pack, tmp_path):
    import shutil

    bad = tmp_path / "bad.lmdb"
    shutil.copytree(pack, bad)
    r = open_reader(bad)
    data = r.read(4).data
    r.close()
    raw = bytearray((bad / "data.mdb").read_bytes())
    raw[raw.index(data) + 10] ^= 0x01
    (bad / "data.mdb").write_bytes(bytes(raw))
    r = CliRunner().invoke(main, ["export", str(bad), str(tmp_path / "o"), "--to", "wds"])
    assert r.exit_code == 1 and "11 of 12 samples exported" in r.output
    assert "failed [read]" in r.output and "at sample 4" in r.output and "CRC32C mismatch" in r.output
    r = CliRunner().invoke(main, ["export", str(bad), str(tmp_path / "o2"), "--to", "wds", "--max-failures", "1"])
    assert r.exit_code == 0 and "1 failed" in r.output
