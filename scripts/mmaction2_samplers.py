"""Record the frame indices mmaction2's own samplers draw, as test data for packer's samplers.

Runs mmaction2 1.2's real transforms (``SampleFrames`` with and without ``target_fps``,
``DenseSampleFrames``, ``UntrimmedSampleFrames``) after ``np.random.seed(seed)`` on a grid of
cases and writes ``tests/support/reference/mmaction2_samplers.json.gz``;
``tests/data/test_samplers.py`` checks that packer's samplers, given ``np.random.RandomState(seed)``,
return the same arrays.

mmaction2 pulls mmengine/mmcv, so this runs in a separate environment, not packer's:

    python -m venv .venv-bench
    .venv-bench/bin/pip install --no-deps mmaction2==1.2.0 mmengine==0.10.7 mmcv-lite==2.1.0 \
        addict yapf termcolor rich platformdirs        # plus numpy, torch, opencv
    .venv-bench/bin/python scripts/mmaction2_samplers.py
"""
from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
from mmaction.datasets.transforms.loading import DenseSampleFrames, SampleFrames, UntrimmedSampleFrames

OUT = Path(__file__).resolve().parent.parent / "tests" / "support" / "reference" / "mmaction2_samplers.json.gz"
TOTALS = (1, 7, 33, 65, 301)
SEEDS = (0, 7)


def run(transform, total: int, seed: int, fps=None, start_index: int = 1):
    np.random.seed(seed)
    results = {"total_frames": total, "start_index": start_index}
    if fps is not None:
        results["avg_fps"] = fps
    try:
        return transform(results)["frame_inds"].tolist()
    except Exception as e:  # recorded: packer must refuse the same cases
        return {"error": type(e).__name__}


def cases():
    out = []
    fps_grid = [dict(clip_len=c, frame_interval=i, num_clips=n, test_mode=t, target_fps=30,
                     out_of_bound_opt=o, twice_sample=tw, keep_tail_frames=kt)
                for c, i, n, t, o, tw, kt in itertools.product(
                    (1, 4, 8), (1, 4), (1, 3), (False, True), ("loop", "repeat_last"), (False, True),
                    (False, True))
                if not (tw and not t) and not (kt and t) and not (tw and n == 1 and c > 1)]
    for kw in fps_grid:
        for fps in (None, 29.97, 60.0):
            for total in TOTALS:
                for seed in SEEDS[: 1 if kw["test_mode"] else 2]:
                    out.append({"sampler": "SampleFrames", "kwargs": kw, "total_frames": total, "fps": fps,
                                "seed": seed, "frame_inds": run(SampleFrames(**kw), total, seed, fps)})
    dense_grid = [dict(clip_len=c, frame_interval=i, num_clips=n, test_mode=t, sample_range=r,
                       num_sample_positions=p, out_of_bound_opt=o, temporal_jitter=j)
                  for c, i, n, t, r, p, o, j in itertools.product(
                      (1, 8), (1, 3), (1, 4), (False, True), (32, 64), (10, 3), ("loop", "repeat_last"),
                      (False, True))
                  if not (p != 10 and not t)]
    for kw in dense_grid:
        for total in TOTALS:
            for seed in SEEDS[: 1 if kw["test_mode"] and not kw["temporal_jitter"] else 2]:
                out.append({"sampler": "DenseSampleFrames", "kwargs": kw, "total_frames": total, "fps": None,
                            "seed": seed, "frame_inds": run(DenseSampleFrames(**kw), total, seed)})
    for c, ci, i in itertools.product((1, 2, 5), (1, 16, 32), (1, 3)):
        kw = dict(clip_len=c, clip_interval=ci, frame_interval=i)
        for total in TOTALS:
            out.append({"sampler": "UntrimmedSampleFrames", "kwargs": kw, "total_frames": total, "fps": None,
                        "seed": 0, "frame_inds": run(UntrimmedSampleFrames(**kw), total, 0)})
    return out


def main() -> None:
    import mmaction

    data = {"source": f"mmaction2 {mmaction.__version__}, mmaction/datasets/transforms/loading.py, "
                      "after np.random.seed(seed); start_index 1; written by scripts/mmaction2_samplers.py",
            "cases": cases()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(gzip.compress((json.dumps(data, separators=(",", ":")) + "\n").encode(), mtime=0))
    print(f"{OUT}: {len(data['cases'])} cases")


if __name__ == "__main__":
    main()
