"""List and label files as users have them, end to end on generated videos in the real formats:
UCF-101 (XviD AVI in its folder names, CRLF split files, 1-based classInd.txt), Kinetics
(``{id}_{start:06d}_{end:06d}.mp4``, label maps with spaces and parentheses, validation CSVs
that miss classes), mmaction2 multi-label lists, flat folders without classes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from packer import FrameDataset, PackedVideoDataset
from packer.cli import main
from packer.commands.decode_frames import decode_frames
from packer.errors import UsageError
from packer.formats import FORMATS, open_reader
from packer.conversion.options import InputOptions, RunOptions
from tests.support.inputs import write_video

PACKED = sorted(FORMATS)
UCF = [("ApplyEyeMakeup", "v_ApplyEyeMakeup_g01_c01"), ("ApplyEyeMakeup", "v_ApplyEyeMakeup_g02_c01"),
       ("BandMarching", "v_BandMarching_g01_c01"), ("YoYo", "v_YoYo_g01_c01"), ("YoYo", "v_YoYo_g02_c03")]


def cli(*args) -> str:
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def out_path(tmp_path: Path, to: str) -> Path:
    return tmp_path / (f"{to}.h5" if to in FORMATS and FORMATS[to][0].single_file else to)


@pytest.fixture(scope="module")
def ucf(tmp_path_factory) -> Path:
    """UCF-101 as downloaded: XviD AVIs in class folders and ucfTrainTestlist/ with CRLF files."""
    base = tmp_path_factory.mktemp("ucf")
    for i, (cls, stem) in enumerate(UCF):
        write_video(base / "UCF-101" / cls / f"{stem}.avi", frames=6 + i, size=(32, 40), seed=i, fourcc="XVID")
    lists = base / "ucfTrainTestlist"
    lists.mkdir()
    (lists / "classInd.txt").write_bytes(b"1 ApplyEyeMakeup\r\n2 BandMarching\r\n3 YoYo\r\n")
    (lists / "trainlist01.txt").write_bytes(b"ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi 1\r\n"
                                            b"BandMarching/v_BandMarching_g01_c01.avi 2\r\n"
                                            b"YoYo/v_YoYo_g01_c01.avi 3\r\n")
    (lists / "testlist01.txt").write_bytes(b"ApplyEyeMakeup/v_ApplyEyeMakeup_g02_c01.avi\r\n"
                                           b"YoYo/v_YoYo_g02_c03.avi\r\n")
    return base


def test_ucf101_split_files_with_class_index(ucf, tmp_path):
    assert (ucf / "UCF-101" / "YoYo" / "v_YoYo_g01_c01.avi").read_bytes()[:4] == b"RIFF"
    lists = ucf / "ucfTrainTestlist"
    train, test = tmp_path / "train", tmp_path / "test"
    cli("decode-frames", ucf / "UCF-101", train, "--list", lists / "trainlist01.txt",
        "--class-index", lists / "classInd.txt", "--workers", "1")
    cli("decode-frames", ucf / "UCF-101", test, "--list", lists / "testlist01.txt",
        "--class-index", lists / "classInd.txt", "--workers", "1")
    # 0-based labels, as mmaction2's build_file_list makes them from classInd.txt
    assert (train / "rawframes.txt").read_text() == ("ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01 6 0\n"
                                                     "BandMarching/v_BandMarching_g01_c01 8 1\n"
                                                     "YoYo/v_YoYo_g01_c01 9 2\n")
    # the test list has no labels: each video takes its class from its folder
    assert (test / "rawframes.txt").read_text() == ("ApplyEyeMakeup/v_ApplyEyeMakeup_g02_c01 7 0\n"
                                                    "YoYo/v_YoYo_g02_c03 10 2\n")
    assert open_reader(train).classes == open_reader(test).classes == ["ApplyEyeMakeup", "BandMarching", "YoYo"]
    assert [FrameDataset(test)[i][1] for i in range(2)] == [0, 2]


def test_ucf101_lists_without_class_index_say_what_they_are(ucf, tmp_path, caplog):
    lists = ucf / "ucfTrainTestlist"
    report = decode_frames(ucf / "UCF-101", tmp_path / "t",
                           input_options=InputOptions(list_path=lists / "testlist01.txt"),
                           run_options=RunOptions(workers=1, timeout=600.0))
    assert report.videos == 2 and (tmp_path / "t" / "rawframes.txt").read_text().split("\n")[0].endswith(" -1")
    with caplog.at_level("WARNING"):
        decode_frames(ucf / "UCF-101", tmp_path / "tr",
                      input_options=InputOptions(list_path=lists / "trainlist01.txt"),
                      run_options=RunOptions(workers=1, timeout=600.0))
    assert "labels start at 1" in caplog.text


def test_a_list_label_that_contradicts_its_folder_is_refused(ucf, tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"YoYo/v_YoYo_g01_c01.avi 1\r\n")
    with pytest.raises(UsageError, match="folder 'YoYo'"):
        decode_frames(ucf / "UCF-101", tmp_path / "o",
                      input_options=InputOptions(list_path=tmp_path / "bad.txt", class_index=ucf / "ucfTrainTestlist" / "classInd.txt"))


K400_MAP = ["abseiling", "air drumming", "passing American football (in game)",
            "passing American football (not in game)", "zumba"]


@pytest.fixture(scope="module")
def kinetics(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("k400")
    rows = [("air drumming", "abc123DEF_-", 10, 20, "val"), ("zumba", "Zz9_-x", 0, 10, "val"),
            ("passing American football (not in game)", "p0p0p0p0p0a", 3, 13, "val")]
    for i, (_, yid, start, end, _) in enumerate(rows):
        write_video(base / "val" / f"{yid}_{start:06d}_{end:06d}.mp4", frames=5 + i, size=(32, 40), seed=i)
    (base / "label_map_k400.txt").write_text("\n".join(K400_MAP) + "\n")
    # the validation CSV misses classes: numbering from it alone would shift labels
    (base / "validate.csv").write_text("label,youtube_id,time_start,time_end,split\n" + "".join(
        f'"{label}",{yid},{start},{end},{split}\n' for label, yid, start, end, split in rows))
    (base / "train.csv").write_text("label,youtube_id,time_start,time_end,split\n" + "".join(
        f'"{label}",id{i},0,10,train\n' for i, label in enumerate(reversed(K400_MAP))))
    return base


@pytest.mark.parametrize("index", ["label_map_k400.txt", "train.csv"])
def test_kinetics_validation_labels_come_from_the_label_map(kinetics, tmp_path, index):
    out = tmp_path / "val"
    cli("decode-frames", kinetics / "val", out, "--csv", kinetics / "validate.csv",
        "--class-index", kinetics / index, "--workers", "1")
    r = open_reader(out)
    assert r.classes == K400_MAP
    got = {v["key"]: v["label"] for v in r.manifest.videos}
    assert got == {"abc123DEF_-_000010_000020.mp4": 1, "Zz9_-x_000000_000010.mp4": 4,
                   "p0p0p0p0p0a_000003_000013.mp4": 3}
    assert "passing_American_football_(not_in_game)/p0p0p0p0p0a_000003_000013 7 3" in \
        (out / "rawframes.txt").read_text().splitlines()


def test_kinetics_validation_csv_alone_is_refused(kinetics, tmp_path):
    with pytest.raises(UsageError, match="may miss classes"):
        decode_frames(kinetics / "val", tmp_path / "o",
                      input_options=InputOptions(csv_path=kinetics / "validate.csv"))


def test_multi_label_list_in_every_format(tmp_path):
    src = tmp_path / "videos"
    for i, name in enumerate(["a.mp4", "b.mp4", "c.mp4"]):
        write_video(src / name, frames=6 + i, size=(32, 40), seed=i)
    (tmp_path / "list.txt").write_text("a.mp4 0 2\nb.mp4 1\nc.mp4 3 1 0\n")
    outs = {}
    for to in ["frames"] + PACKED:
        outs[to] = out_path(tmp_path, to)
        decode_frames(src, outs[to], to=to, input_options=InputOptions(list_path=tmp_path / "list.txt"),
                      run_options=RunOptions(workers=1, timeout=600.0))
    assert (outs["frames"] / "rawframes.txt").read_text() == "a 6 0 2\nb 7 1\nc 8 3 1 0\n"
    want = [[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 0, 1]]
    frames = FrameDataset(outs["frames"], multi_class=True, num_classes=4, seed=0)
    assert [frames[i][1].tolist() for i in range(3)] == want and frames[0][1].dtype == torch.float32
    for to, out in outs.items():
        r = open_reader(out)
        assert r.classes == ["0", "1", "2", "3"]
        assert [v.get("labels") for v in r.manifest.videos] == [[0, 2], None, [3, 1, 0]], to
        ds = PackedVideoDataset(out, multi_class=True, seed=0)  # num_classes from the manifest
        assert [ds[i][1].tolist() for i in range(3)] == want, to
        assert torch.equal(ds[2][0], frames[2][0])
    single = PackedVideoDataset(outs[PACKED[0]], seed=0)
    assert single[1][1] == 1
    with pytest.raises(UsageError, match="multi_class=True"):
        single[0]


def test_flat_folder_packs_with_label_minus_one(tmp_path, caplog):
    for i, name in enumerate(["x.mp4", "y.avi"]):
        write_video(tmp_path / "flat" / name, frames=5, size=(32, 40), seed=i)
    with caplog.at_level("WARNING"):
        report = decode_frames(tmp_path / "flat", tmp_path / "o", run_options=RunOptions(workers=1, timeout=600.0))
    assert "no class folders" in caplog.text and report.videos == 2
    assert (tmp_path / "o" / "rawframes.txt").read_text() == "x 5 -1\ny 5 -1\n"
    m = json.loads((tmp_path / "o" / "packer.json").read_text())
    assert m["classes"] == [] and [v["label"] for v in m["videos"]] == [-1, -1]
    assert FrameDataset(tmp_path / "o")[0][1] == -1


def test_class_folders_are_numbered_in_mmaction2_order(tmp_path):
    for i, cls in enumerate(["a b", "a(b)"]):
        write_video(tmp_path / "src" / cls / "v.mp4", frames=4, size=(32, 40), seed=i)
    decode_frames(tmp_path / "src", tmp_path / "o", run_options=RunOptions(workers=1, timeout=600.0))
    assert open_reader(tmp_path / "o").classes == ["a(b)", "a b"]
    assert (tmp_path / "o" / "rawframes.txt").read_text() == "a(b)/v 4 0\na_b/v 4 1\n"
