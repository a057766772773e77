"""Labels as the dataset defines them (issue 31, case 8): a class-folder tree of a dataset packer
knows gets that dataset's labels, never an order packer made up; a validation tree that lacks
classes is refused until the training classes are given, then numbered as mmaction2 numbers
it; an image validation tree can be numbered from the training classes. Every case here gave
wrong labels without an error before (byte order swapped four UCF-101 classes; the Kinetics
validation tree was numbered 0, 1, 2, 3 on its own; image packs had no way to number a subset).
"""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.inputs import write_image_folder, write_video
from tests.support.faults import CONVERSIONS, one_fast
from packer.cli import main
from packer.commands.decode_frames import decode_frames
from packer.commands.pack_images import pack_images
from packer.conversion.labelmaps import KNOWN
from packer.errors import UsageError
from packer.formats import open_reader
from packer.conversion.options import InputOptions, RunOptions

DECODES = [c for c in CONVERSIONS if c.id.startswith("decode-frames")]
# UCF-101's classInd.txt, 0-based: byte order gives Hammering 35, HammerThrow 34, JumpingJack 47, JumpRope 46
UCF_SWAPPED = {"Hammering": 34, "HammerThrow": 35, "JumpingJack": 46, "JumpRope": 47}


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def class_tree(root: Path, classes: list[str], videos: dict[str, int]) -> Path:
    """``root/<class>/`` for every class (empty), a 4-frame video in the classes of ``videos``."""
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
    for i, c in enumerate(videos):
        write_video(root / c / f"v_{i}.avi", frames=4, size=(16, 16), seed=i)
    return root


def labels_by_class(out: Path) -> dict[str, int]:
    videos = open_reader(out, check_crc=False).manifest.videos
    return {v["frame_dir"].split("/")[0]: v["label"] for v in videos}


def created_by(out: Path) -> dict:
    return open_reader(out, check_crc=False).manifest.created_by["options"]


@pytest.mark.parametrize("conv", one_fast(DECODES))
def test_ucf101_class_folders_get_classind_s_labels(tmp_path, conv):
    src = class_tree(tmp_path / "UCF-101", KNOWN["ucf101"].classes, UCF_SWAPPED)
    out = conv.out(tmp_path)
    r = cli(*conv.argv(src, out, "--workers", 0))
    assert r.exit_code == 0, r.output
    assert labels_by_class(out) == UCF_SWAPPED
    reader = open_reader(out)
    assert [reader.classes[x] for x in UCF_SWAPPED.values()] == list(UCF_SWAPPED)
    assert {reader.read(i).label for i in range(len(reader))} == set(UCF_SWAPPED.values())  # the samples too
    assert created_by(out)["label_map"] == "ucf101"
    assert "labels: the class folders are UCF-101's 101 classes" in r.output and "classInd.txt" in r.output


def mmaction2_kinetics_labels(train_csv: Path) -> dict[str, int]:
    """mmaction2's tools/data/parse_file_list.py parse_kinetics_splits: the class mapping every
    split (train, val) is labelled with, made from the training CSV."""
    def convert_label(s):
        return s.replace('"', "").replace(" ", "_")

    with open(train_csv) as f:
        rows = csv.reader(f)
        next(rows)
        labels_sorted = sorted({convert_label(row[0]) for row in rows})
    return {label: i for i, label in enumerate(labels_sorted)}


def test_a_kinetics_validation_tree_lacking_classes_is_refused_then_numbered_like_mmaction2(tmp_path):
    k400 = KNOWN["kinetics400"].classes
    train_csv = tmp_path / "kinetics_train.csv"
    train_csv.write_text("label,youtube_id,time_start,time_end,split\n"
                         + "".join(f'"{c}",id{i:04d},0,10,train\n' for i, c in enumerate(k400)))
    folders = [c.replace(" ", "_") for c in k400]  # as rename_classnames.sh leaves them
    val = [c for c in folders if c not in ("air_drumming", "answering_questions")]
    src = class_tree(tmp_path / "val", val, dict.fromkeys(val[:4]))  # abseiling, applauding, ...
    with pytest.raises(UsageError, match="part of the classes of Kinetics-400's 400 .lacking air drumming, "
                                         "answering questions.*--class-index"):
        decode_frames(src, tmp_path / "refused", run_options=RunOptions(workers=0, timeout=600.0))
    assert not (tmp_path / "refused").exists()
    r = cli("decode-frames", src, tmp_path / "out", "--workers", 0)  # the command says the same
    assert r.exit_code != 0 and "--class-index" in r.output and not (tmp_path / "out").exists()
    reference = mmaction2_kinetics_labels(train_csv)
    expected = {c: reference[c] for c in val[:4]}
    assert list(expected.values()) == [0, 3, 4, 5]
    for given in ("kinetics400", train_csv):
        out = tmp_path / f"out-{Path(str(given)).stem}"
        decode_frames(src, out, input_options=InputOptions(class_index=given),
                      run_options=RunOptions(workers=0, timeout=600.0))
        assert labels_by_class(out) == expected
        assert created_by(out)["label_map"] == ("kinetics400" if given == "kinetics400" else str(train_csv))


def test_a_class_index_lacking_a_folder_is_refused(tmp_path):
    src = class_tree(tmp_path / "videos", ["abseiling", "yoga", "my own class"], {"yoga": 0})
    with pytest.raises(UsageError, match="classes not in kinetics400: my own class"):
        decode_frames(src, tmp_path / "out", input_options=InputOptions(class_index="kinetics400"),
                      run_options=RunOptions(workers=0, timeout=600.0))
    images = write_image_folder(tmp_path / "images", count=4, classes=2, size=(16, 16))
    (tmp_path / "train_classes.txt").write_text("class_0\nclass_9\n")
    with pytest.raises(UsageError, match="classes not in .*train_classes.txt: class_1"):
        pack_images(images, tmp_path / "out.lmdb",
                    input_options=InputOptions(class_index=tmp_path / "train_classes.txt"),
                    run_options=RunOptions(workers=0))


def test_something_something_folders_get_the_label_ids(tmp_path):
    # sorting the templates with spaces as '_' (mmaction2's Kinetics rule, the old default)
    # puts "Lifting something up completely, then ..." (28) before "... without ..." (27)
    sthv2 = KNOWN["sthv2"].classes
    chosen = {sthv2[27]: 27, sthv2[28]: 28}
    src = class_tree(tmp_path / "sthv2", sthv2, chosen)
    decode_frames(src, tmp_path / "out", run_options=RunOptions(workers=0, timeout=600.0))
    assert labels_by_class(tmp_path / "out") == {c.replace(" ", "_"): x for c, x in chosen.items()}
    assert created_by(tmp_path / "out")["label_map"] == "sthv2"


@pytest.mark.parametrize("conv", one_fast([c for c in CONVERSIONS if c.source == "images"]))
def test_an_image_validation_tree_is_numbered_from_the_training_classes(tmp_path, conv):
    train = write_image_folder(tmp_path / "train", count=8, classes=4, size=(16, 16))
    (tmp_path / "classes.txt").write_text("".join(f"{d.name}\n" for d in sorted(train.iterdir())))
    val = write_image_folder(tmp_path / "val", count=8, classes=4, size=(16, 16))
    for p in (val / "class_1").iterdir():
        p.unlink()
    (val / "class_1").rmdir()
    out = conv.out(tmp_path)
    r = cli(*conv.argv(val, out, "--workers", 0, "--class-index", tmp_path / "classes.txt"))
    assert r.exit_code == 0, r.output
    reader = open_reader(out)
    got = {reader.keys[i].split("/")[0]: reader.read(i).label for i in range(len(reader))}
    assert got == {"class_0": 0, "class_2": 2, "class_3": 3}
    assert reader.classes == ["class_0", "class_1", "class_2", "class_3"]
    assert created_by(out)["label_map"] == str(tmp_path / "classes.txt")
    assert "labels: 4 classes numbered by --class-index" in r.output


def test_the_training_data_itself_numbers_a_validation_tree(tmp_path):
    train = write_image_folder(tmp_path / "train", count=6, classes=3, size=(16, 16))
    (train / "class_0").rename(train / "Zebra")  # byte order: Zebra 0, class_1 1, class_2 2
    pack_images(train, tmp_path / "train.h5", format="hdf5", run_options=RunOptions(workers=0))
    val = write_image_folder(tmp_path / "val", count=4, classes=3, size=(16, 16))
    shutil.rmtree(val / "class_0")
    for given in (train, tmp_path / "train.h5"):  # the training tree, or what it was packed into
        out = tmp_path / f"val-{given.name}.lmdb"
        pack_images(val, out, input_options=InputOptions(class_index=given), run_options=RunOptions(workers=0))
        reader = open_reader(out)
        assert {reader.keys[i].split("/")[0]: reader.read(i).label for i in range(len(reader))} \
            == {"class_1": 1, "class_2": 2}
    k400 = KNOWN["kinetics400"].classes
    videos = class_tree(tmp_path / "k400_train", k400, {})  # a Kinetics training tree numbers its part
    val = class_tree(tmp_path / "k400_val", ["yoga", "abseiling"], {"yoga": 0, "abseiling": 1})
    decode_frames(val, tmp_path / "frames", input_options=InputOptions(class_index=videos),
                  run_options=RunOptions(workers=0, timeout=600.0))
    assert labels_by_class(tmp_path / "frames") == {"abseiling": 0, "yoga": 398}


def test_folders_of_no_known_dataset_keep_byte_order_and_say_so(tmp_path):
    images = write_image_folder(tmp_path / "images", count=4, classes=2, size=(16, 16))
    (images / "class_0").rename(images / "Zebra")  # byte order: "Zebra" before "class_1"
    r = cli("to-lmdb", images, tmp_path / "images.lmdb", "--workers", 0)
    assert r.exit_code == 0, r.output
    assert open_reader(tmp_path / "images.lmdb").classes == ["Zebra", "class_1"]
    assert "label_map" not in created_by(tmp_path / "images.lmdb")  # the manifest as it always was
    assert "labels: 2 class folders numbered in sorted order (byte order): 0 Zebra, 1 class_1" in r.output
    videos = class_tree(tmp_path / "videos", ["b c", "b(c)", "a"], {"b c": 0, "b(c)": 1})
    r = cli("decode-frames", videos, tmp_path / "frames", "--workers", 0)
    assert r.exit_code == 0, r.output
    assert labels_by_class(tmp_path / "frames") == {"b(c)": 1, "b_c": 2}  # mmaction2: spaces as '_'
    assert "label_map" not in created_by(tmp_path / "frames")  # sorted order: the manifest as it always was
    assert "labels: 3 class folders of no dataset packer knows" in r.output
    manifest = json.loads((tmp_path / "frames" / "packer.json").read_text())
    assert manifest["classes"] == ["a", "b(c)", "b c"]
