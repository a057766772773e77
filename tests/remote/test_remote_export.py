"""``packer export`` of a pack at a URL: read through the node cache (every sample checked as a
local read is), the same shards as an export of the local copy, the URL recorded as the source."""
from __future__ import annotations

import json
import shutil

import pytest

import packer
from tests.support.inputs import write_image_folder

pytest.importorskip("webdataset")


@pytest.mark.parametrize("fmt", ["records", "lmdb"])
def test_an_export_of_a_served_pack_is_the_export_of_the_local_one(nginx, tmp_path, monkeypatch, fmt):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    local = tmp_path / "local"
    packer.pack(write_image_folder(tmp_path / "src", count=15), local, format=fmt, workers=0,
                **({"samples_per_shard": 4} if fmt == "records" else {}))
    shutil.copytree(local, nginx.root / f"export-{fmt}")
    url = nginx.url(f"export-{fmt}")
    served = packer.export(url, tmp_path / "from-url", to="wds", samples_per_shard=6)
    mine = packer.export(local, tmp_path / "from-disk", to="wds", samples_per_shard=6)
    assert served.count == mine.count == 15 and served.shards == 3
    for name in ("shard-000000.tar", "shard-000001.tar", "shard-000002.tar"):
        assert (tmp_path / "from-url" / name).read_bytes() == (tmp_path / "from-disk" / name).read_bytes()
    record = json.loads((tmp_path / "from-url" / "export.json").read_text())
    assert record["source"]["path"] == url
    assert record["source"]["identity"] == json.loads((tmp_path / "from-disk" / "export.json").read_text())[
        "source"]["identity"]
