"""Model layers that go with packer's data side: multigrid's sub-batch BatchNorm.

``SubBatchNorm3d`` follows facebookresearch/SlowFast's ``batchnorm_helper.py`` (see
``packer.data.multigrid`` for the schedule that changes the batch size it must absorb).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SubBatchNorm3d", "aggregate_sub_bn_stats", "set_sub_bn_splits"]


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")
    return value


class SubBatchNorm3d(nn.Module):
    """BatchNorm3d whose training statistics come from ``num_splits`` sub-batches.

    Multigrid's long cycle multiplies the per-process batch by up to 8; normalising over
    sub-batches of the base size keeps BatchNorm's noise what the model will see at the
    full shape. In training, split ``s`` holds samples ``s, s + k, s + 2k, ...``
    (``k = num_splits``; a free reshape of the batch to ``(n / k, k * C, T, H, W)``, as
    SlowFast does) and has its own running statistics; one affine ``weight``/``bias`` is
    shared by all splits. In evaluation the module is a plain BatchNorm3d over the
    aggregated statistics, which ``aggregate_stats()`` computes; ``eval()`` calls it for you
    when the module leaves training mode.

    Aggregation (SlowFast's ``_get_aggregated_mean_std``): with split running means
    ``m_s`` and variances ``v_s``, ``mean = avg_s m_s`` and
    ``var = avg_s v_s + avg_s (m_s - mean)^2`` (within-split plus between-split variance).
    For one batch this is the whole batch's variance exactly when ``v_s`` are the biased
    split variances; BatchNorm keeps unbiased ones (``x m/(m-1)`` for ``m`` values per split
    and channel), so the aggregate exceeds the whole batch's biased variance by
    ``avg_s v_s / m``, which is negligible for video activations.

    Args:
        num_features: channels ``C`` of the ``(N, C, T, H, W)`` input.
        num_splits: sub-batches per batch; a training batch must have a multiple of it.
        eps, momentum, affine, track_running_stats, device, dtype: as ``nn.BatchNorm3d``.
    """

    def __init__(self, num_features: int, num_splits: int, *, eps: float = 1e-5,
                 momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None):
        super().__init__()
        self.num_features = _positive_int("num_features", num_features)
        self.num_splits = _positive_int("num_splits", num_splits)
        if momentum is not None and not 0 <= momentum <= 1:
            raise ValueError(f"momentum must be in [0, 1] or None, not {momentum!r}")
        self.eps = float(eps)
        self.momentum = momentum
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        factory = {"device": device, "dtype": dtype}
        if self.affine:
            self.weight = nn.Parameter(torch.ones(num_features, **factory))
            self.bias = nn.Parameter(torch.zeros(num_features, **factory))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if self.track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features, **factory))
            self.register_buffer("running_var", torch.ones(num_features, **factory))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device))
            self.register_buffer("split_running_mean", torch.zeros(num_splits * num_features, **factory))
            self.register_buffer("split_running_var", torch.ones(num_splits * num_features, **factory))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked",
                         "split_running_mean", "split_running_var"):
                self.register_buffer(name, None)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, num_splits={self.num_splits}, eps={self.eps}, "
                f"momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")

    def _average_factor(self) -> float:
        """BatchNorm's running-average factor for this step (cumulative when momentum is None)."""
        if not (self.training and self.track_running_stats):
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 5:
            raise ValueError(f"SubBatchNorm3d expects (N, C, T, H, W) input, got shape {tuple(x.shape)}")
        if x.shape[1] != self.num_features:
            raise ValueError(f"SubBatchNorm3d({self.num_features}) got {x.shape[1]} channels")
        if not self.training:
            # Without running statistics BatchNorm normalises by the batch, also in eval.
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                not self.track_running_stats, 0.0, self.eps)
        n, c = x.shape[:2]
        k = self.num_splits
        if n % k:
            raise ValueError(f"SubBatchNorm3d: a batch of {n} samples does not split into {k} "
                             "equal sub-batches (use drop_last=True in the sampler)")
        factor = self._average_factor()
        y = F.batch_norm(x.reshape(n // k, k * c, *x.shape[2:]), self.split_running_mean,
                         self.split_running_var, None, None, True, factor, self.eps)
        y = y.reshape(x.shape)
        if self.affine:
            y = y * self.weight.view(1, -1, 1, 1, 1) + self.bias.view(1, -1, 1, 1, 1)
        return y

    @torch.no_grad()
    def aggregate_stats(self) -> None:
        """Fold the splits' running statistics into the evaluation ones (see the class doc)."""
        if not self.track_running_stats:
            return
        means = self.split_running_mean.view(self.num_splits, self.num_features)
        variances = self.split_running_var.view(self.num_splits, self.num_features)
        mean = means.mean(0)
        self.running_mean.copy_(mean)
        self.running_var.copy_(variances.mean(0) + ((means - mean) ** 2).mean(0))

    @torch.no_grad()
    def set_num_splits(self, num_splits: int) -> None:
        """Change the number of sub-batches (e.g. when the long cycle changes the batch size).

        The statistics are aggregated first and every new split starts from them.
        """
        num_splits = _positive_int("num_splits", num_splits)
        if self.track_running_stats:
            self.aggregate_stats()
            self.split_running_mean = self.running_mean.repeat(num_splits)
            self.split_running_var = self.running_var.repeat(num_splits)
        self.num_splits = num_splits

    def train(self, mode: bool = True) -> "SubBatchNorm3d":
        if self.training and not mode:
            self.aggregate_stats()
        return super().train(mode)


def _sub_bns(module: nn.Module) -> list[SubBatchNorm3d]:
    return [m for m in module.modules() if isinstance(m, SubBatchNorm3d)]


def aggregate_sub_bn_stats(module: nn.Module) -> int:
    """Call ``aggregate_stats()`` on every ``SubBatchNorm3d`` in ``module``; returns how many."""
    found = _sub_bns(module)
    for m in found:
        m.aggregate_stats()
    return len(found)


def set_sub_bn_splits(module: nn.Module, num_splits: int) -> int:
    """Set ``num_splits`` of every ``SubBatchNorm3d`` in ``module``; returns how many."""
    found = _sub_bns(module)
    for m in found:
        m.set_num_splits(num_splits)
    return len(found)
