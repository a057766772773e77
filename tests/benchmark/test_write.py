"""``packer bench --write``: the writer's ceiling, the 1 -> 2 worker scaling and the plan per
worker count (packer/benchmark/write.py)."""
from __future__ import annotations

import json

from click.testing import CliRunner

from packer.cli import main


def test_bench_write_prints_the_ceiling_scaling_and_model(image_folder):
    r = CliRunner().invoke(main, ["bench", str(image_folder), "--write", "records", "--workers", "0,1,2"])
    assert r.exit_code == 0, r.output
    for text in ("writer ceiling:", "1 -> 2 workers:", "model rate(N)", "| 2 | sharded |", "| 0 | inline |"):
        assert text in r.output
    r = CliRunner().invoke(main, ["bench", str(image_folder), "--write", "lmdb", "--check", "full",
                                  "--workers", "1,2", "--json"])
    assert r.exit_code == 0, r.output
    result = json.loads(r.output)
    assert result["plans"] == {"1": "inline", "2": "shm"} and result["writer_ceiling"] > 0
