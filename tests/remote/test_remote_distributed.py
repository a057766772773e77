"""One download per shard per node: 2 gloo ranks x 2 DataLoader workers, all four reading the
same records over HTTP (nginx) into one shared cache folder, counted from nginx's access log."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader

from packer.data import PackedDataset, StreamingDataset
from packer.remote import cache_events
from tests.support.served import records_dataset

# xdist: the nginx tests share one worker, so nginx (a session fixture) starts once
pytestmark = pytest.mark.xdist_group("nginx")


WORLD = 2


def _rank_main(rank: int, url: str, cache: str, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        ds = StreamingDataset(url, decode="bytes", shuffle=True, seed=3, buffer_size=8, cache_dir=cache)
        ds.set_epoch(1)
        keys = []
        # fork, as DataLoader does by default on Linux: a rank started by spawn would otherwise
        # spawn its workers too (a fresh interpreter and torch import per worker)
        for data, label in DataLoader(ds, num_workers=2, batch_size=None, multiprocessing_context="fork"):
            keys.append(data.hex()[:64])
        gathered = [None] * WORLD
        dist.all_gather_object(gathered, keys)
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_two_workers_download_each_shard_once(nginx, tmp_path):
    local = records_dataset(nginx.root, "dist", count=80, per_shard=6)
    cache = tmp_path / "shared-cache"
    out = tmp_path / "seen.json"
    tmp.spawn(_rank_main, args=(nginx.url("dist"), str(cache), str(tmp_path / "init"), str(out)),
              nprocs=WORLD, join=True)
    per_rank = json.loads(out.read_text())
    assert [len(r) for r in per_rank] == [40, 40]
    want = sorted(d.hex()[:64] for d, _ in (PackedDataset(local, decode="bytes")[i] for i in range(80)))
    assert sorted(per_rank[0] + per_rank[1]) == want  # every sample exactly once across ranks
    shards = sorted(p.name for p in local.glob("*.tfrecord"))
    got = {uri.rsplit("/", 1)[-1]: n for uri, n in nginx.downloads().items() if uri.startswith("/d/dist/")}
    assert got == {name: 1 for name in shards}, got
    fetched = [e for e in cache_events(cache) if e["file"].endswith(".tfrecord")]
    assert len(fetched) == len(shards) and len({e["pid"] for e in fetched}) > 1  # shared by processes
