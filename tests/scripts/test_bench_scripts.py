"""Every benchmark in scripts/bench runs at its --quick size and writes the JSON render.py reads;
the committed docs/benchmarks.md is what render.py makes of the committed results."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_bench(module: str, args: list[str], results: Path, timeout: int = 900) -> dict:
    """``python -m module --quick ... --results DIR`` from the repository root, as a user runs it;
    returns its one JSON document."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", module, *args, "--results", str(results)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    files = sorted(results.glob("*.json"))
    assert len(files) == 1, files
    doc = json.loads(files[0].read_text())
    assert {"bench", "machine", "command", "notes", "figures"} <= set(doc)
    assert {"date", "cores", "cpu_model", "load_avg", "python", "torch", "commit"} <= set(doc["machine"])
    assert doc["command"].startswith(f"python -m {module} ")
    return doc


def rows_by(section: dict) -> dict[tuple, dict]:
    return {(e["row"]["source"], e["row"].get("pipeline"), e["row"].get("loader"), e["row"].get("parallel")): e
            for e in section["results"]}


def check_loaders(sections: dict, missing: list[str]) -> None:
    loaders = rows_by(sections["loaders"])
    for source in ("ceiling", "folder", "packer/lmdb"):
        for pipe in ("packer", "pillow"):
            e = loaders[(source, pipe, "DataLoader", 0)]
            assert e["samples_per_s"] > 0 and e["best"]["samples"] == 2 * 8
            proc = e["best"]["process"]  # the child's whole life, from os.wait4
            assert proc["wall_s"] > 0 and proc["user_s"] + proc["sys_s"] > 0 and proc["minflt"] > 0
            assert e["best"]["window"]["user_s"] >= 0 and e["minflt"] >= 0
    assert loaders[("packer/lmdb", "packer", "Loader", 2)]["samples_per_s"] > 0
    assert loaders[("floor/lmdb", "packer", "DataLoader", 0)]["samples_per_s"] > 0  # the bound, a row of its own
    target = {t["name"]: t for t in sections["loaders"]["targets"]}["packer/lmdb vs the LMDB floor, DataLoader 0 workers"]
    assert target["target"] == 0.95 and target["value"] > 0
    assert loaders[("packer/lmdb", "packer (tuned heap)", "Loader", 2)]["samples_per_s"] > 0
    names = [t["name"] for t in sections["loaders"]["targets"]]
    assert "packer/lmdb vs in-memory ceiling, DataLoader 0 workers" in names
    assert any("heap tuned by hand" in n for n in names)
    for peer in missing:
        assert "not installed" in sections["loaders"]["skipped"][peer]
        assert f"skipped {peer}: not installed" in sections["loaders"]["markdown"]


def check_ipc(sections: dict, missing: list[str]) -> None:
    ipc = {e["row"]["variant"]: e for e in sections["ipc"]["results"]}
    assert len(ipc) == 8 and all(e["samples_per_s"] > 0 for e in ipc.values())
    for e in ipc.values():  # the main process apart from its workers, within the whole
        assert 0 <= e["best"]["window_main"]["minflt"] <= e["best"]["window"]["minflt"]
    assert "pin_memory=True" in sections["ipc"]["skipped"] or "pin_memory=True" in ipc


def check_bench(sections: dict, missing: list[str]) -> None:
    row = sections["bench"]["results"]["0"]  # num_workers=0 (a JSON key)
    assert row["plain"][0]["samples_per_s"] > 0 and row["bench"][0]["samples_per_s"] > 0 and row["ratio"] > 0
    assert "packer bench num_workers=0 vs a plain script" in sections["bench"]["targets"][0]["name"]


def check_training_formats_raw(sections: dict, missing: list[str]) -> None:
    training = rows_by(sections["training"])
    for loader in ("Loader", "DataLoader"):
        assert training[("packer/lmdb", "train", loader, 2)]["samples_per_s"] > 0
    formats = {e["row"]["source"] for e in sections["formats"]["results"] if "samples_per_s" in e}
    assert formats == {"ceiling", "packer/lmdb"}
    assert {e["row"]["source"] for e in sections["raw"]["results"] if "samples_per_s" in e} == {
        "packer/lmdb-jpeg224", "packer/hdf5-jpeg224", "packer/hdf5-raw224", "floor/hdf5-raw224"}


def check_in_process(sections: dict, missing: list[str]) -> None:
    costs = sections["costs"]["results"]
    assert set(costs["decode_us"]) == {"packer", "pillow", "train", "tensor"}  # crc_us: records only
    assert {"ceiling", "folder", "packer/lmdb"} <= set(costs["fetch_us"])
    assert costs["item_us"]["lmdb floor (get, CRC32C, Datum parse)"] > 0
    assert sections["shuffle"]["mixing"]["default (block shuffle)"]["ratio"] > 0
    assert "| pipeline | CPU ms/image | speed-up |" in sections["crops"]["markdown"]
    same = re.search(r"pixels equal to the full decode in (\d+) of (\d+) box decodes", sections["crops"]["markdown"])
    assert same and same[1] == same[2] != "0"  # the restart-marker bound decodes the boxes exactly
    # the timed region decode gives the full decode's output, bit for bit (no DCT-scaled box here)
    assert set(sections["crops"]["equal_to_full_decode"].values()) == {1.0}
    assert all(t["value"] > 0 for t in sections["crops"]["targets"])
    assert 0 < sections["prefetch"]["results"]["ratio"] < 1


# every read section, in groups of about equal CPU (--quick on 2 cores: ~21 s of rows, ~13 s, ~21 s),
# each group its own run, so xdist spreads them; more groups would each import torch again
READ_GROUPS = {"loaders": (check_loaders,), "ipc,bench": (check_ipc, check_bench),
               "training,formats,raw,costs,shuffle,crops,prefetch": (check_training_formats_raw, check_in_process)}


def test_read_groups_cover_every_section():
    from scripts.bench.read import SECTIONS

    grouped = [s for g in READ_GROUPS for s in g.split(",")]
    assert sorted(grouped) == sorted(SECTIONS), "add the new read section to a READ_GROUPS entry"


READ_QUICK = ["--quick", "--workers", "0", "--threads", "2", "--formats", "lmdb", "--train-peers", "none"]


@pytest.fixture(scope="session")
def read_workdir(tmp_path_factory) -> Path:
    """One --quick workdir for the read groups of this run (the xdist workers' temp folders sit in
    the run's own): the images and the LMDB most sections read are made here once, under a lock,
    by the benchmark's own functions, which key them by their inputs; each group then finds them."""
    import fcntl

    from scripts.bench.common import image_folder
    from scripts.bench.read import packed, parse

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    work = shared / "read-quick-work"
    args = parse(READ_QUICK + ["--workdir", str(work)])
    with open(shared / "read-quick-work.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        src = image_folder(work / f"images-{args.count}", count=args.count, classes=args.classes)
        packed(src, work / f"packed-{args.count}" / "data.lmdb", "lmdb", workers=2)
    return work


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("group", list(READ_GROUPS))
def test_read_quick_every_section_in_fresh_processes(tmp_path, read_workdir, group):
    """Every section at --quick size over one format (the per-format rows run the same code), each
    row a fresh process; a peer whose package is absent is named in ``skipped``, never faked."""
    missing = [p for p, mod in (("webdataset", "webdataset"), ("litdata", "litdata"), ("mds", "streaming"))
               if importlib.util.find_spec(mod) is None]
    doc = run_bench("scripts.bench.read", READ_QUICK + ["--section", group, "--workdir", str(read_workdir),
                                                        "--peers", ",".join(missing) or "none"], tmp_path / "results")
    sections = doc["figures"]["sections"]
    assert list(sections) == group.split(",")
    for check in READ_GROUPS[group]:
        check(sections, missing)
    for name, sec in sections.items():
        assert sec["markdown"].strip(), name


def test_read_probes_the_peers_in_the_peer_interpreter_by_importing_them(tmp_path, monkeypatch):
    """``--peer-python``: the peers are imported in a fresh process of that interpreter, so a peer
    whose package is present but fails to import is skipped with its error (not run and crashed),
    a missing one says "not installed", and an interpreter that cannot run skips them all."""
    from scripts.bench.read import peer_env

    broken = tmp_path / "site" / "streaming"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "site"), str(REPO),
                                                      os.environ.get("PYTHONPATH", "")]))
    skipped: dict[str, str] = {}
    ok, env = peer_env(sys.executable, ["mds", "spdl"], skipped)
    assert "mds" not in ok
    assert skipped["mds"] == (f"does not import in {sys.executable}: "
                              "RuntimeError: operator torchvision::nms does not exist")
    if __import__("importlib").util.find_spec("spdl") is None:
        assert skipped["spdl"].startswith(f"not installed in {sys.executable}")
    assert env["python"] == sys.executable and env["torch"]

    skipped = {}
    assert peer_env("/bin/false", ["webdataset", "litdata"], skipped) == ([], {"python": "/bin/false"})
    assert skipped == {p: "the peers' interpreter /bin/false failed: exit 1" for p in ("webdataset", "litdata")}


def test_read_probe_reports_the_installed_distributions_version(tmp_path, monkeypatch):
    """A peer's version is its installed distribution's, not the package's own ``__version__``
    (ffcv 1.0.2's says 0.0.3rc1), and a distribution whose name does not hold the module's last
    part (another ``nvidia-*`` wheel beside ``nvidia-dali-*``) is not taken for it."""
    import importlib

    from scripts.bench.read import dist_version

    site = tmp_path / "site"
    (site / "stalepeer").mkdir(parents=True)
    (site / "stalepeer" / "__init__.py").write_text("__version__ = '0.0.3rc1'\n")
    for dist, version in (("stalepeer", "1.0.2"), ("other_stale_wheel", "9.9")):
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "top_level.txt").write_text("stalepeer\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    try:
        assert dist_version("stalepeer", importlib.import_module("stalepeer")) == "1.0.2"
    finally:
        sys.modules.pop("stalepeer", None)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("module, section, expect", [
    ("scripts.bench.write", "write", "to-lmdb"),
    ("scripts.bench.write", "breakdown", "| the writer | CPU µs/sample |"),
    ("scripts.bench.write", "frame-crc", "check_crc=True (default)"),
    ("scripts.bench.write", "warmth", "pause between the delete and the write"),
    ("scripts.bench.write", "scale", "2 workers"),
    ("scripts.bench.write", "hooks", "| keeps_samples | to-lmdb"),
    ("scripts.bench.write", "margin", "per sample at the margin"),
    ("scripts.bench.video", "flow", "| dis |"),
    ("scripts.bench.video", "clips", "decode-frames --workers 2"),
    ("scripts.bench.resize", "pre-resize", "resized / original"),
    ("scripts.bench.export", "export", "packer export --to wds / bare tar + checks"),
    ("scripts.bench.append", "append", "**append / pack**"),
])
def test_section_quick(tmp_path, module, section, expect):
    doc = run_bench(module, ["--quick", section], tmp_path / "results")
    sec = doc["figures"]["sections"][section]
    assert sec["argv"] and sec["seconds"] > 0
    assert expect in sec["markdown"]
    if section in ("write", "clips", "pre-resize", "export", "append"):  # the README table's figures (and export's, append's)
        assert sec["figures"]["targets"] and all(t["value"] > 0 for t in sec["figures"]["targets"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_coco_quick(tmp_path):
    """Memory against pycocotools, write speed against an image-only pack, read against the source."""
    doc = run_bench("scripts.bench.coco", ["--quick", "all"], tmp_path / "results")
    sections = doc["figures"]["sections"]
    assert "pycocotools COCO(file)" in sections["rss"]["markdown"]
    assert "field pack / images alone" in sections["write"]["markdown"]
    assert "pycocotools + Pillow decode" in sections["read"]["markdown"]
    for name in ("rss", "write", "read"):
        assert all(t["value"] > 0 for t in sections[name]["figures"]["targets"]), name
    rows = sections["rss"]["figures"]["rows"]
    assert all(r["count"] == 300 and r["hwm"] > 0 for r in rows.values())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_remote_quick(tmp_path):
    if not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")):
        pytest.skip("nginx is not installed: the remote benchmark serves its shards with it")
    doc = run_bench("scripts.bench.remote", ["--quick", "streaming"], tmp_path / "results")
    sec = doc["figures"]["sections"]["streaming"]
    assert "| local disk | " in sec["markdown"]
    assert "every sample exactly once: yes" in sec["markdown"]
    names = {t["name"] for t in sec["figures"]["targets"] if t["value"] > 0}
    assert "warm cache vs local disk, CPU per sample in one process" in names


def test_committed_benchmarks_page_is_rendered_from_the_committed_results(tmp_path):
    """docs/benchmarks.md, docs/video.md's packs block and the README's figures table are render.py's
    output for docs/bench-results (run the render after a run), and every README row has its figure."""
    from scripts.bench.render import FIGURES_BEGIN, FIGURES_END, NOT_MEASURED

    readme = (REPO / "README.md").read_text()
    block = readme[readme.index(FIGURES_BEGIN):readme.index(FIGURES_END)]
    assert NOT_MEASURED not in block, "a README figure is in no full run of docs/bench-results"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "scripts.bench.render", "--check"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_render_shows_each_sections_newest_full_run(tmp_path):
    """A full run wins over a newer quick one; each section comes from the newest run that has it."""
    def doc(date: str, quick: bool, sections: dict[str, str]) -> dict:
        return {"bench": "write", "command": f"python -m scripts.bench.write {date}", "notes": [],
                "machine": {"date": date, "cores": 2, "cpu_model": "cpu", "load_avg": [1.0], "python": "3",
                            "torch": "2", "numpy": "2", "commit": "abc"},
                "figures": {"quick": quick, "sections": {k: {"markdown": v} for k, v in sections.items()}}}

    (tmp_path / "a.json").write_text(json.dumps(doc("2026-01-01", False, {"write": "| old |\n|---|"})))
    (tmp_path / "b.json").write_text(json.dumps(doc("2026-01-02", True, {"write": "| quick |\n|---|"})))
    (tmp_path / "c.json").write_text(json.dumps(doc("2026-01-03", False, {"breakdown": "plain text"})))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-m", "scripts.bench.render", "--results", str(tmp_path), "--out",
                    str(tmp_path / "page.md")], cwd=REPO, env=env, check=True, timeout=120)
    page = (tmp_path / "page.md").read_text()
    assert "| old |" in page and "| quick |" not in page
    assert "```text\nplain text\n```" in page
    assert page.index("### Writing: write") < page.index("### Writing: breakdown")


def render_stale_page(tmp_path: Path, results: Path, flag: str, page: Path):
    """Render ``results`` into ``page`` (``flag``: ``--video-page`` or ``--readme``) after checking
    that ``--check`` calls the page stale; returns a function that runs ``--check`` again."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = [sys.executable, "-m", "scripts.bench.render", "--results", str(results), "--out", str(tmp_path / "b.md"),
            flag, str(page)]

    def check() -> int:
        return subprocess.run(args + ["--check"], cwd=REPO, env=env, capture_output=True, timeout=120).returncode

    assert check() == 1
    subprocess.run(args, cwd=REPO, env=env, check=True, timeout=120)
    return check


def test_render_fills_the_video_packs_block_from_the_newest_packs_run(tmp_path):
    """docs/video.md's GOP table is rendered from a `video packs` JSON, between its markers, and
    --check says when it is stale."""
    from scripts.bench.render import VIDEO_BEGIN, VIDEO_END

    committed = sorted((REPO / "docs" / "bench-results").glob("video-*.json"))
    doc = next(json.loads(p.read_text()) for p in reversed(committed)
               if "packs" in json.loads(p.read_text())["figures"]["sections"])
    results = tmp_path / "results"
    results.mkdir()
    (results / "video.json").write_text(json.dumps(doc))
    page = tmp_path / "video.md"
    page.write_text(f"# Video\n\nbefore\n\n{VIDEO_BEGIN}\nhand-typed, stale\n{VIDEO_END}\n\nafter\n")
    check = render_stale_page(tmp_path, results, "--video-page", page)
    text = page.read_text()
    assert "hand-typed" not in text and text.startswith("# Video\n\nbefore\n") and text.endswith("after\n")
    fig = doc["figures"]["sections"]["packs"]["figures"]
    for gop, e in fig["video_packs"].items():
        assert f" | {e['bytes'] / 1e6:.1f} | {e['bytes_vs_frames']:.3f} | " in text, gop
    assert doc["command"] in text and "**8 (default)**" in text
    assert check() == 0


def test_render_fills_the_readme_figures_from_the_newest_full_run_of_each(tmp_path):
    """Each README figure comes from the newest full run that holds it (a target by name, or a key
    path into the section), with that run's date; a newer quick run never counts; --check says
    when the block is stale; a figure no run holds is shown as not measured."""
    from scripts.bench.render import FIGURES_BEGIN, FIGURES_END, NOT_MEASURED, README_FIGURES

    def doc(date: str, quick: bool, costs: float, loader: float) -> dict:
        t = [{"name": k[2], "value": loader, "target": 2.0, "at_most": False, "met": True, "who": ""}
             for row in README_FIGURES for k in row.keys if k[:2] == ("read", "loaders")]
        return {"bench": "read", "command": "python -m scripts.bench.read", "notes": [],
                "machine": {"date": date, "cores": 2, "load_avg": [1.0]},
                "figures": {"quick": quick, "sections": {
                    "loaders": {"markdown": "x", "targets": t},
                    "costs": {"markdown": "y", "results": {"crc_share": costs, "crc_us": 6.25}}}}}

    results = tmp_path / "results"
    results.mkdir()
    (results / "a.json").write_text(json.dumps(doc("2026-01-01T00:00:00+00:00", False, 0.01, 3.0)))
    (results / "b.json").write_text(json.dumps(doc("2026-01-02T00:00:00+00:00", False, 0.02, 4.0)))
    (results / "c.json").write_text(json.dumps(doc("2026-01-03T00:00:00+00:00", True, 0.03, 5.0)))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{FIGURES_BEGIN}\nhand-typed 9.99x\n{FIGURES_END}\n\nafter\n")
    check = render_stale_page(tmp_path, results, "--readme", readme)
    text = readme.read_text()
    assert "hand-typed" not in text and text.startswith("# x\n") and text.endswith("after\n")
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in text.splitlines() if line.startswith("| ")}
    crc = rows["both masked CRC32Cs of a record, share of read + decode"]
    assert crc[1:4] == ["2.0% (6.2 us)", "< 3%", "2026-01-02"], crc
    peers = next(v for k, v in rows.items() if k.startswith("packer's default `Loader`"))
    assert peers[1] == "4.00x (4.00-4.00) / 4.00x (4.00-4.00); wall 4.00x (4.00-4.00) / 4.00x (4.00-4.00)", peers
    assert peers[3] == "2026-01-02", peers
    raw = next(v for k, v in rows.items() if k.startswith("HDF5 `--raw` pixels at 224x224"))
    assert raw[1] == NOT_MEASURED, raw
    faults = next(v for k, v in rows.items() if k.startswith("fault-injection cases"))
    assert faults[1].isdigit() and int(faults[1]) > 0
    assert check() == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_baseline_quick(tmp_path):
    """This checkout against itself at --quick size: every row runs in both trees and has a ratio."""
    doc = run_bench("scripts.bench.baseline", ["--quick", "--base-tree", str(REPO), "--workdir",
                                               str(tmp_path / "work"), "--rows",
                                               "to-lmdb --check header,StreamingDataset(decode='bytes')"],
                    tmp_path / "results")
    sec = doc["figures"]["sections"]["baseline"]
    assert [t["name"].split(":")[0] for t in sec["targets"]] == ["to-lmdb --check header",
                                                                  "StreamingDataset(decode='bytes')"]
    assert all(len(rounds["base"]) == len(rounds["this"]) == 1 for rounds in sec["results"].values())
