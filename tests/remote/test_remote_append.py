"""An output appended to while it is read over HTTP (a real nginx serving the folder the append
writes): a reader opened before reads only its version's samples or ``OutputChanged`` while the
append runs and after it, never a mix; a reader opened after reads the new version, parts and
new shards included."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from packer.data import PackedDataset
from packer.errors import OutputChanged
from packer.formats import FORMATS
from tests.support.inputs import write_image_folder
from tests.support.killing import packer_cmd, packer_env
from tests.support.served import pack

pytestmark = pytest.mark.xdist_group("nginx")  # one worker runs the nginx tests (one server)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_reader_over_http_keeps_its_version_while_the_output_grows(fmt, nginx, tmp_path):
    src = write_image_folder(tmp_path / "src", count=12, classes=3, size=(24, 32))
    late = write_image_folder(tmp_path / "late", count=5, classes=1, size=(24, 32), seed=4)
    name = f"grow-{fmt}" + (".h5" if fmt == "hdf5" else "")
    out = nginx.root / name
    layout = ("--samples-per-shard", "3") if fmt == "records" else ("--commit-every", "3")
    pack(fmt, src, out, *layout)
    old = PackedDataset(nginx.url(name), decode="bytes", cache_dir=tmp_path / "cache")
    before = [old[i] for i in range(len(old))]
    shutil.copytree(late / "class_0", src / "class_3", copy_function=shutil.copy2)
    proc = subprocess.Popen(packer_cmd(f"to-{fmt}", src, out, "--workers", "0", *layout, "--append"),
                            env=packer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while True:
        running = proc.poll() is None
        for i, sample in enumerate(before):
            try:
                assert old[i] == sample, f"sample {i} is not the version the reader opened"
            except OutputChanged:
                pass
        if not running:
            break
    _, err = proc.communicate()
    assert proc.returncode == 0, err.decode()
    new = PackedDataset(nginx.url(name), decode="bytes", cache_dir=tmp_path / "cache2")
    local = PackedDataset(out, decode="bytes")
    assert len(new) == len(local) == 17 and new.manifest.version == 2
    assert [new[i] for i in range(len(new))] == [local[i] for i in range(len(local))]
    assert [new[i] for i in range(12)] == before
