"""``packer bench``: runs on a tiny dataset in seconds; its JSON has the documented fields."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from packer.codecs import image as imaging, jpeg_region
from packer.benchmark.run import JSON_FIELDS, SETTING_FIELDS, parse_workers, run_bench
from packer.benchmark.fresh import USAGE_FIELDS
from packer.cli import main
from packer.errors import UsageError
from packer.commands.pack_images import pack_images
from packer.conversion.options import RunOptions

TINY = ["--batch-size", "8", "--steps", "2", "--resize", "32", "--crop", "32"]


@pytest.fixture(scope="module")
def packed(image_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny.lmdb"
    pack_images(image_folder, out, format="lmdb", run_options=RunOptions(workers=0))
    return out


def check_result(r: dict, workers: list[int], count: int) -> None:
    assert set(r) == set(JSON_FIELDS)
    assert r["count"] == count and r["format"] == "lmdb"
    assert r["ceiling"]["samples_per_s"] > 0 and r["sample_bytes"] > 0
    assert r["decoders"] == {"full": imaging.DECODER, "region": jpeg_region.available(),
                             "backend": jpeg_region.backend(), "library": jpeg_region.library_path()}
    assert [s["num_workers"] for s in r["settings"]] == workers
    for s in r["settings"]:
        assert set(s) == set(SETTING_FIELDS)
        assert s["samples_per_s"] > 0 and s["first_batch_s"] > 0 and s["worker_startup_s"] >= 0
        assert s["ratio_to_ceiling"] == pytest.approx(s["samples_per_s"] / r["ceiling"]["samples_per_s"])
        assert s["mb_per_s"] == pytest.approx(s["samples_per_s"] * r["sample_bytes"] / 1e6)
        assert s["data_bound"] == (s["ratio_to_ceiling"] < 0.95)
        assert s["slowdown"] >= 1.0 and s["verdict"]
        assert s["wait_ms_p95"] >= s["wait_ms_median"] >= 0
        # each setting ran in its own fresh process: its whole life and the epoch it timed
        assert set(s["process"]) == set(USAGE_FIELDS)
        # (CPU is charged by ticks: a 30 ms process on a busy machine may get no user tick; the
        # process's user + sys is held below it: at least the timed window's)
        assert s["process"]["wall_s"] > 0 and s["process"]["user_s"] >= 0 and s["process"]["maxrss_mb"] > 0
        assert set(s["window"]) == {"user_s", "sys_s", "minflt"} and s["window"]["minflt"] >= 0
        assert 0 < s["window"]["user_s"] + s["window"]["sys_s"] <= s["process"]["user_s"] + s["process"]["sys_s"]
    rec = r["recommended"]
    assert rec["num_workers"] in workers and rec["reasons"]
    assert isinstance(rec["persistent_workers"], bool)
    assert (rec["prefetch_factor"] is None) == (rec["num_workers"] == 0)
    assert r["cache"]["sample_shape"] == [3, 32, 32]
    assert r["cache"]["bytes"] == count * (3 * 32 * 32 + 8)
    assert isinstance(r["cache"]["fits"], bool)
    assert r["verdict"].startswith(f"num_workers={rec['num_workers']}")
    fid = {row["pipeline"]: row for row in r["fidelity"]}
    assert len(fid) == 4 and all(row["images"] == 16 for row in fid.values())
    fast = fid["DecodeResizeCrop(32, 32)"]
    assert fast["shift_median"] < 0.15 and fast["psnr_median"] > 25


def test_library_call_with_against_and_model_step(packed, image_folder):
    r = run_bench(packed, batch_size=8, workers=[0, 1], resize=32, crop=32, steps=2, model_ms=20,
                  against=image_folder, progress=False)
    check_result(r, [0, 1], 24)
    # each consumed batch sleeps 20 ms, so neither the ceiling nor a loader can beat 8 / 0.02 s
    assert r["ceiling"]["samples_per_s"] <= 8 / 0.020
    for s in r["settings"]:
        assert s["against"]["samples_per_s"] > 0 and set(s["against"]["process"]) == {*USAGE_FIELDS, "window"}
        assert s["against"]["ratio"] == pytest.approx(s["samples_per_s"] / s["against"]["samples_per_s"])
    json.dumps(r)  # serialisable as it is


@pytest.fixture(scope="module")
def cli_json(packed) -> dict:
    """``packer bench --json --workers 0`` on the tiny pack, run once for the tests that read it."""
    res = CliRunner().invoke(main, ["bench", str(packed), "--json", "--workers", "0", *TINY])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_cli_json(cli_json):
    check_result(cli_json, [0], 24)


def test_cli_table(packed):
    res = CliRunner().invoke(main, ["bench", str(packed), "--workers", "0,2", "--decode", "pil", *TINY])
    assert res.exit_code == 0, res.output
    assert "ceiling (same batches from memory" in res.stdout
    assert "recommended: num_workers=" in res.stdout
    assert "device cache: 24 x 3x32x32 uint8" in res.stdout
    assert "| DecodeRandomResizedCrop(32) |" in res.stdout
    assert "JPEG decoder: " in res.stdout and "region decoding: " in res.stdout


def test_cli_plot(packed, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    res = CliRunner().invoke(main, ["bench", str(packed), "--workers", "0", "--plot", str(png), *TINY])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_help_documents_every_json_field():
    res = CliRunner().invoke(main, ["bench", "--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    for field in [*JSON_FIELDS, *SETTING_FIELDS]:
        assert f"{field}:" in text, field


def test_bad_arguments(packed, tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["bench", str(packed), "--workers", "a,b"])
    assert res.exit_code != 0 and "--workers must be comma-separated integers" in res.output
    res = runner.invoke(main, ["bench", str(tmp_path / "missing")])
    assert res.exit_code != 0 and "does not exist" in res.output
    res = runner.invoke(main, ["bench", str(packed), "--steps", "0"])
    assert res.exit_code != 0 and "steps must be >= 1" in res.output
    with pytest.raises(UsageError):
        parse_workers("-1")
    assert parse_workers("2,0,2") == [0, 2]


def test_full_size_decode_of_mixed_sizes_is_a_clear_error(packed):
    # the tiny images differ in size: full-size decode cannot be batched
    res = CliRunner().invoke(main, ["bench", str(packed), "--decode", "tensor", "--workers", "0", *TINY])
    assert res.exit_code != 0
    assert "cannot batch samples with --decode tensor" in res.output and "differ in shape" in res.output


def slow_python_transform(image):
    """A transform in pure Python that holds the GIL (what a user's augmentation can be)."""
    total = 0
    for v in range(20000):
        total += v
    return image


def test_threads_and_mixing_fields(packed, cli_json):
    t, m = cli_json["threads"], cli_json["mixing"]
    assert t["samples_per_s"] > 0 and t["one_thread_samples_per_s"] > 0 and t["threads"] >= 2
    assert t["scaling"] == pytest.approx(t["samples_per_s"] / t["one_thread_samples_per_s"])
    assert t["advice"] and t["holds_gil"] in (True, False, None) and t["available"] > 0
    assert sorted(t["process"], key=int) == ["1", str(t["threads"])]
    # a forked child's CPU is counted in clock ticks: a tiny run may show 0 on a loaded machine
    assert all(set(p) == {*USAGE_FIELDS, "window"} and p["wall_s"] > 0 and p["user_s"] >= 0
               for p in t["process"].values())
    assert m["batch_size"] == 8 and 2.9 < m["iid"] < 3.0  # 3 classes x 8 images, 8-batches
    assert m["stored"]["median"] == 1  # a class-sorted pack read in stored order
    assert m["streaming"]["median"] >= 2 and m["streaming"]["ratio"] == pytest.approx(m["streaming"]["median"] / m["iid"])
    res = CliRunner().invoke(main, ["bench", str(packed), "--workers", "0", *TINY,
                                    "--transform", f"{__name__}:slow_python_transform"])
    assert res.exit_code == 0, res.output
    assert "threads: packer.Loader" in res.output and "mixing: distinct classes" in res.output
    res = CliRunner().invoke(main, ["bench", str(packed), "--transform", "nomodule"])
    assert res.exit_code != 0 and "module:callable" in res.output


def test_gil_verdict_rule():
    from packer.benchmark.threads import gil_verdict

    assert gil_verdict(1.05, cpus=2, threads=2, available=1.9)["holds_gil"] is True
    assert "DataLoader" in gil_verdict(1.05, cpus=2, threads=2, available=1.9)["advice"]
    assert gil_verdict(1.8, cpus=2, threads=2, available=1.9)["holds_gil"] is False
    assert gil_verdict(1.8, cpus=1, threads=2)["holds_gil"] is None
    assert gil_verdict(1.05, cpus=2, threads=2, available=1.1)["holds_gil"] is None  # too busy to tell


def record_pid(image):
    """A transform that notes the process it runs in (``$BENCH_PID_LOG``)."""
    with open(os.environ["BENCH_PID_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")
    return image


def test_every_configuration_runs_in_a_fresh_process(packed, tmp_path, monkeypatch):
    """The DataLoader settings (num_workers=0: the transform runs in the loading process itself)
    and both thread counts each load in their own process, never in the one running bench."""
    log = tmp_path / "pids"
    monkeypatch.setenv("BENCH_PID_LOG", str(log))
    r = run_bench(packed, batch_size=8, workers=[0], resize=32, crop=32, steps=2, fidelity=0,
                  transform=f"{__name__}:record_pid", progress=False)
    pids = {int(v) for v in log.read_text().split()}
    assert r["settings"][0]["samples_per_s"] > 0
    # the ceiling's held batches are read here (this process); every timed configuration elsewhere:
    # one num_workers=0 process and two packer.Loader processes (1 and N threads)
    assert len(pids - {os.getpid()}) == 3, pids
