"""``--shuffle SEED`` on the image pack commands: a seeded permutation of the inputs, same contents."""
from __future__ import annotations

import random

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.commands.pack_images import pack_images
from packer.conversion.fingerprint import Fingerprint, input_stats
from packer.conversion.inputs import image_items, shuffle_items
from packer.data.mixing import distinct_per_batch
from packer.errors import UsageError
from packer.formats import open_reader
from packer.conversion.options import RunOptions

COMMANDS = {"lmdb": ("to-lmdb", "o.lmdb"), "hdf5": ("to-hdf5", "o.h5"),
            "records": ("to-records", "o.records")}


@pytest.mark.parametrize("fmt", sorted(COMMANDS))
def test_shuffle_stores_a_seeded_permutation_of_the_inputs(image_folder, tmp_path, fmt):
    cmd, name = COMMANDS[fmt]
    out = tmp_path / name
    extra = ["--samples-per-shard", "5"] if fmt == "records" else []
    r = CliRunner().invoke(main, [cmd, str(image_folder), str(out), "--shuffle", "7", "--workers", "0", *extra])
    assert r.exit_code == 0, r.output
    reader = open_reader(out)
    inputs = sorted(p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*.jpg"))
    want = list(inputs)
    random.Random(7).shuffle(want)
    assert list(reader.keys) == want != inputs  # keys still name the sources, in the seeded order
    classes = reader.classes
    for i, key in enumerate(reader.keys):  # reading back gives exactly the inputs, each under its key
        rec = reader.read(i)
        assert rec.data == (image_folder / key).read_bytes()
        assert classes[rec.label] == key.split("/")[0]
    assert reader.manifest.created_by["options"]["shuffle"] == 7
    # class-sorted input (3 classes, 24 images): a plain pack's 6-batches hold 1 class, shuffled ones more
    labels = [reader.read(i).label for i in range(len(reader))]
    assert distinct_per_batch(labels, 6).mean() > 2


def fingerprint(items) -> dict:
    """The inputs part of the resume fingerprint (keys and labels in order, then the files)."""
    return Fingerprint(format="lmdb", classes=[], options={}, stats=input_stats(items)).inputs


def test_no_shuffle_keeps_sorted_order_and_the_seed_changes_the_resume_fingerprint(image_folder, tmp_path):
    pack_images(image_folder, tmp_path / "plain", format="lmdb", run_options=RunOptions(workers=0))
    reader = open_reader(tmp_path / "plain")
    assert list(reader.keys) == sorted(reader.keys) and "shuffle" not in reader.manifest.created_by["options"]
    items, _ = image_items(image_folder)
    assert fingerprint(shuffle_items(items, 1)) != fingerprint(shuffle_items(items, 2)) != fingerprint(items)
    assert shuffle_items(items, 1) == shuffle_items(items, 1)
    with pytest.raises(UsageError):
        shuffle_items(items, -1)
    r = CliRunner().invoke(main, ["to-lmdb", str(image_folder), str(tmp_path / "x"), "--shuffle", "-3"])
    assert r.exit_code != 0 and "-3" in r.output
