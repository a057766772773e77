"""Labels, keys, class names and the manifest are covered by checksums like the sample bytes:
for every format, a changed label, a swapped key, renamed classes or an edited manifest field is
a ``PackerError`` naming the file when the output is opened or read, and ``packer verify`` reports
it; never a wrong label, key or class returned silently."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import lmdb
import pytest

from packer.codecs.protowire import decode_datum, encode_datum
from packer.commands.decode_frames import decode_frames
from packer.commands.inspection import verify_dataset
from packer.commands.pack_images import pack_images
from packer.errors import PackerError
from packer.formats import open_reader
from packer.formats.hdf5.layout import MANIFEST_ATTR
from packer.formats.lmdb.env import close_env, lmdb_key
from packer.conversion.options import RunOptions
from tests.support.inputs import write_image_folder, write_video_folder

OUTPUTS = ["lmdb", "hdf5", "records", "frames", "frames-hdf5"]
KINDS = ["label", "key", "classes", "manifest"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("labels")
    images = write_image_folder(root / "images", count=9, classes=3, size=(24, 28))
    videos = write_video_folder(root / "videos", per_class=1, classes=2, frames=5, size=(24, 32))
    outs = {}
    for name in OUTPUTS:
        out = root / (f"{name}.h5" if name.endswith("hdf5") else name)
        if name.startswith("frames"):
            decode_frames(videos, out, to="hdf5" if name.endswith("hdf5") else "frames",
                          run_options=RunOptions(workers=0, timeout=600.0))
        else:
            pack_images(images, out, format=name, run_options=RunOptions(workers=0))
        outs[name] = out
    return outs


def _edit_manifest(out: Path, change) -> None:
    if out.is_file():
        with h5py.File(out, "r+") as f:
            m = json.loads(f.attrs[MANIFEST_ATTR])
            change(m)
            f.attrs[MANIFEST_ATTR] = json.dumps(m)
    else:
        m = json.loads((out / "packer.json").read_text())
        change(m)
        (out / "packer.json").write_text(json.dumps(m, indent=1))


def _relabel_record(shard: Path) -> None:
    """Change the first record's ``image/class/label`` value in place (a valid varint)."""
    raw = bytearray(shard.read_bytes())
    at = raw.index(b"image/class/label") + len(b"image/class/label")
    # Feature{int64_list{value: [label]}}: 0x12 len 0x1a len 0x0a len VARINT
    assert raw[at] == 0x12 and raw[at + 2] == 0x1a and raw[at + 4] == 0x0a, "unexpected Example layout"
    raw[at + 6] ^= 0x01
    shard.write_bytes(bytes(raw))


def damage(name: str, kind: str, out: Path) -> None:
    if kind == "classes":
        _edit_manifest(out, lambda m: m.update(classes=list(reversed(m["classes"]))))
    elif kind == "manifest":
        _edit_manifest(out, lambda m: m.update(failures=m["failures"] + 5))
    elif name.startswith("frames") and (kind == "label" or name == "frames"):
        field = "label" if kind == "label" else "key"
        _edit_manifest(out, lambda m: m["videos"][0].update({field: (m["videos"][0][field] + 1) if field == "label"
                                                            else m["videos"][1][field]}))
    elif out.is_file():  # hdf5: the label and key arrays beside the sample bytes
        with h5py.File(out, "r+") as f:
            if kind == "label":
                f["labels"][0] = f["labels"][0] + 1
            else:
                a, b = f["keys"][0], f["keys"][1]
                f["keys"][0], f["keys"][1] = b, a
    elif kind == "key":
        keys = json.loads((out / "keys.json").read_text())
        keys[0], keys[1] = keys[1], keys[0]
        (out / "keys.json").write_text(json.dumps(keys))  # still a valid list of the right length
    elif name == "lmdb":
        close_env(out)
        env = lmdb.open(str(out), subdir=True, lock=False)
        with env.begin(write=True) as txn:
            d = decode_datum(txn.get(lmdb_key(0)))
            txn.put(lmdb_key(0), encode_datum(bytes(d.data), d.label + 1, d.height, d.width, d.channels))
        env.close()
    else:
        _relabel_record(sorted(out.glob("*.tfrecord"))[0])


def read_everything(out: Path) -> None:
    r = open_reader(out)
    try:
        list(r.keys), list(r.classes)
        for i in range(len(r)):
            r.read(i)
    finally:
        r.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", OUTPUTS)
def test_damage_beside_the_samples_is_caught(name, kind, built, tmp_path):
    out = tmp_path / built[name].name
    (shutil.copy if built[name].is_file() else shutil.copytree)(built[name], out)
    read_everything(out)  # intact: reads cleanly
    damage(name, kind, out)
    with pytest.raises(PackerError) as e:
        read_everything(out)
    assert out.name in str(e.value), e.value
    result = verify_dataset(out)
    assert not result.ok and all(out.name in p for p in result.problems), result.problems
