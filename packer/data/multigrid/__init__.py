"""Multigrid training: a batch-shape schedule, its batch sampler, and sub-batch BatchNorm.

"A Multigrid Method for Efficiently Training Video Models" (Wu, Girshick, He, Feichtenhofer,
Krähenbühl; CVPR 2020) trains a video model on a grid of mini-batch shapes that keeps
``B x T x S^2`` (batch x frames x crop side^2) about constant:

* the **long cycle** changes the shape every few epochs, inside each learning-rate stage,
  from large batches of short small clips ``(T/4, S/sqrt2, 8B)`` to the full shape
  ``(T, S, B)``, and scales the learning rate by the batch multiplier (8, 4, 2, 1);
* the **short cycle** changes the crop side every iteration (``S/2`` with 4x batch,
  ``S/sqrt2`` with 2x batch, ``S`` with 1x batch);
* a short **fine-tune** stage at the full shape (short cycle only) ends training.

Packed frames make this cheap: the loader can fetch any ``T`` and any crop per batch, so a
plain ``DataLoader(dataset, batch_sampler=MultigridBatchSampler(...))`` over
``FrameDataset`` / ``PackedVideoDataset`` gives batches whose shape follows the schedule (the
sampler sends ``packer.data.video.ClipRequest`` keys).

The numbers follow facebookresearch/SlowFast (``slowfast/utils/multigrid.py``,
``slowfast/datasets/multigrid_helper.py``, ``slowfast/models/batchnorm_helper.py``), whose
rounding conventions are spelled out where they apply; the few places where packer differs
on purpose are marked "Differs from SlowFast".
"""
from packer.data.multigrid.sampler import MultigridBatchSampler
from packer.data.multigrid.schedule import MultigridSchedule
# Model layers, re-exported here where multigrid users have always imported them.
from packer.nn import SubBatchNorm3d, aggregate_sub_bn_stats, set_sub_bn_splits

__all__ = ["MultigridSchedule", "MultigridBatchSampler", "SubBatchNorm3d", "aggregate_sub_bn_stats",
           "set_sub_bn_splits"]
