"""Several packs read as one stream: per-source sample counts and the interleaved epoch stream.

``StreamingDataset({"k400.records": 0.7, "mine.records": 0.3}, seed=0)`` mixes by proportion
(weights normalized, ``epoch_size`` samples an epoch: by default the sources' total) or, with
``mix_by="repeat"``, by repeat count (source ``i`` gives ``round(repeat_i x size_i)`` samples an
epoch). The pieces, each a pure function of (seed, epoch):

``mix_counts``    samples per source per epoch, summing exactly to the epoch size (largest
                  remainder), so the proportions hold per epoch, not only on average
``source_picks``  which of a source's samples an epoch uses: whole passes over the source
                  (upsampling), then a seeded subset kept in the source's shard order
``mix_stream``    the sources' picks interleaved at random (seeded), each source's picks in
                  order; the stream ``StreamingDataset`` then splits by rank and block-shuffles

Sample positions of the mixed stream are global: source ``i``'s local position ``p`` is
``offsets[i] + p``.
"""
from __future__ import annotations

import numbers
import os
from typing import Any, Iterable, Sequence

import numpy as np

from packer.errors import UsageError
from packer.remote.url import is_url

__all__ = ["MIX_BY", "mix_counts", "mix_weights", "source_picks", "mix_stream", "same_pack", "distinct_packs"]

MIX_BY = ("proportion", "repeat")


def mix_weights(weights: Iterable[Any]) -> list[float]:
    """The mix's weights as floats: each a real number (``0.5``, ``2``), never a string such as
    ``"0.5"`` or a bool, which ``float()`` would quietly accept; ``UsageError`` naming it otherwise."""
    out = []
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, numbers.Real):
            raise UsageError(f"a mix weight must be a number, not {w!r} ({type(w).__name__})")
        out.append(float(w))
    return out


def same_pack(path: Any) -> Any:
    """What ``path`` names, for telling two spellings of one pack apart from two packs: a local
    path resolved (``A``, ``A/``, ``./A``, ``/abs/A`` and a symlink to it are one), a URL
    without its trailing ``/``, a list of TFRecord files as a tuple of those."""
    if isinstance(path, (list, tuple)):
        return tuple(same_pack(p) for p in path)
    if is_url(path):
        return str(path).rstrip("/")
    return os.path.realpath(os.fspath(path))


def distinct_packs(paths: Iterable[Any]) -> None:
    """``UsageError`` when two of a mix's ``paths`` name one pack (``same_pack``): as two
    sources it would be read twice as often as its weight says, and it is unclear which weight
    was meant. Give it once, with the weight it should have."""
    seen: dict[Any, Any] = {}
    for p in paths:
        key = same_pack(p)
        if key in seen:
            raise UsageError(f"the mix names one pack twice: {seen[key]!r} and {p!r} are both {key!r}; "
                             "give it once, with the weight it should have")
        seen[key] = p


def mix_counts(sizes: Sequence[int], weights: Sequence[float], *, by: str = "proportion",
               epoch_size: int | None = None) -> list[int]:
    """Samples per source in one epoch: proportional to ``weights`` over ``epoch_size`` (default:
    ``sum(sizes)``), or ``round(weight x size)`` per source with ``by="repeat"``."""
    if by not in MIX_BY:
        raise UsageError(f"mix_by must be one of {MIX_BY}, not {by!r}")
    if len(sizes) != len(weights) or not sizes:
        raise UsageError("give one weight per source, and at least one source")
    w = np.asarray(weights, dtype=np.float64)
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise UsageError(f"weights must be finite, >= 0 and not all 0, not {list(weights)}")
    if any(s < 1 for s, x in zip(sizes, w) if x > 0):
        raise UsageError(f"a source with a weight has no samples (sizes {list(sizes)})")
    if by == "repeat":
        if epoch_size is not None:
            raise UsageError("epoch_size comes from the repeat counts with mix_by='repeat'; give one or the other")
        return [int(round(x * s)) for x, s in zip(w, sizes)]
    if epoch_size is not None and (isinstance(epoch_size, bool) or not isinstance(epoch_size, (int, np.integer))):
        raise UsageError(f"epoch_size must be an integer (samples an epoch), not {epoch_size!r}")
    total = sum(sizes) if epoch_size is None else int(epoch_size)
    if total < 1:
        raise UsageError(f"epoch_size must be >= 1, not {epoch_size}")
    exact = w / w.sum() * total
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")  # largest remainders get the leftovers
    counts[order[:total - int(counts.sum())]] += 1
    return counts.tolist()


def source_picks(stream: np.ndarray, n: int, rng: np.random.Generator | None) -> np.ndarray:
    """``n`` samples of a source whose epoch order is ``stream``: ``n // len`` whole passes, then
    a subset of the rest (seeded by ``rng``, kept in ``stream``'s order for read locality; the
    first ones when ``rng`` is None)."""
    size = len(stream)
    whole, part = divmod(int(n), size) if size else (0, 0)
    if rng is None:
        chosen = np.arange(part)
    else:
        chosen = np.sort(rng.choice(size, part, replace=False)) if part else np.zeros(0, np.int64)
    return np.concatenate([np.tile(stream, whole), stream[chosen]]).astype(np.int64)


def mix_stream(picks: Sequence[np.ndarray], offsets: Sequence[int], rng: np.random.Generator | None) -> np.ndarray:
    """The sources' ``picks`` (local positions) interleaved into one stream of global positions:
    slots assigned to sources at random (``rng``), or evenly spread when ``rng`` is None; each
    source's picks keep their order."""
    counts = [len(p) for p in picks]
    which = np.repeat(np.arange(len(picks)), counts)
    if rng is not None:
        rng.shuffle(which)
    else:  # source i's j-th sample at (j + 0.5) / n_i of the stream
        keys = np.concatenate([(np.arange(c) + 0.5) / c for c in counts]) if counts else np.zeros(0)
        which = which[np.argsort(keys, kind="stable")]
    out = np.empty(len(which), dtype=np.int64)
    for i, p in enumerate(picks):
        out[which == i] = np.asarray(p, dtype=np.int64) + int(offsets[i])
    return out

