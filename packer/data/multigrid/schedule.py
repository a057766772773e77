"""``MultigridSchedule``: the long- and short-cycle batch shapes of multigrid training, epoch by
epoch (the method, its paper and SlowFast's rounding conventions: see ``packer.data.multigrid``).
"""
from __future__ import annotations

import dataclasses
import logging
import math
from fractions import Fraction
from typing import Any, Sequence


__all__ = ["MultigridSchedule", "CycleOptions", "count_batches", "DEFAULT_LONG_CYCLE_FACTORS",
           "DEFAULT_SHORT_CYCLE_FACTORS"]

log = logging.getLogger(__name__)

DEFAULT_LONG_CYCLE_FACTORS = ((0.25, 0.7071), (0.5, 0.7071), (0.5, 1), (1, 1))
DEFAULT_SHORT_CYCLE_FACTORS = (0.5, 0.7071)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")
    return value


def _factor(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a number in (0, 1], not {value!r}")
    return float(value)


def _short_cycle_phases(batch_size: int, crop_size: int, full_crop: int,
                        factors: Sequence[float]) -> list[tuple[int, int]]:
    """The ``(batch_size, crop_size)`` of each short-cycle iteration for one long-cycle shape.

    SlowFast's conventions: a short-cycle crop is a fraction of the *full* crop size (not of
    the current long-cycle size), rounded with ``round()`` (``0.7071 * 224 = 158.39 -> 158``);
    its batch multiplier is ``round((S / (f * S_full))^2)`` with the *unrounded* ``f * S_full``
    (``(224 / 158.39)^2 = 2.0001 -> 2``). So at the long-cycle size 158 the short cycle is
    112 px x 2B, 158 px x 1B, 158 px x 1B. The last phase is the long-cycle shape itself.
    Differs from SlowFast: a multiplier that rounds to 0 (a short-cycle crop larger than the
    long-cycle one) is clamped to 1.
    """
    phases = []
    for f in factors:
        side = f * full_crop
        multiplier = max(1, round((crop_size / side) ** 2))
        phases.append((batch_size * multiplier, int(round(side))))
    phases.append((batch_size, crop_size))
    return phases


def count_batches(num_samples: int, batch_sizes: Sequence[int], drop_last: bool) -> int:
    """How many batches cycling through ``batch_sizes`` makes of ``num_samples`` indices."""
    period = sum(batch_sizes)
    full, rest = divmod(num_samples, period)
    count = full * len(batch_sizes)
    for size in batch_sizes:
        if rest == 0:
            break
        if rest < size:
            count += 0 if drop_last else 1
            break
        rest -= size
        count += 1
    return count


@dataclasses.dataclass(frozen=True)
class CycleOptions:
    """Which cycles a ``MultigridSchedule`` runs and their factors (see ``MultigridSchedule``).

    The factors are stored as tuples of floats, checked to lie in (0, 1]; the last long-cycle
    factor must be ``(1, 1)``, the full shape.
    """

    long_cycle: bool = True
    short_cycle: bool = True
    long_cycle_factors: Sequence[tuple[float, float]] = DEFAULT_LONG_CYCLE_FACTORS
    short_cycle_factors: Sequence[float] = DEFAULT_SHORT_CYCLE_FACTORS
    epoch_factor: float = 1.5

    def __post_init__(self) -> None:
        epoch_factor = self.epoch_factor
        if isinstance(epoch_factor, bool) or not isinstance(epoch_factor, (int, float)) \
                or not epoch_factor > 0:
            raise ValueError(f"epoch_factor must be a positive number, not {epoch_factor!r}")
        given = self.long_cycle_factors
        long_factors = tuple((_factor("long_cycle_factors t", t), _factor("long_cycle_factors s", s))
                             for t, s in given)
        if not long_factors or long_factors[-1] != (1.0, 1.0):
            raise ValueError("the last of long_cycle_factors must be (1, 1), the full shape, "
                             f"not {tuple(given)!r}")
        object.__setattr__(self, "long_cycle", bool(self.long_cycle))
        object.__setattr__(self, "short_cycle", bool(self.short_cycle))
        object.__setattr__(self, "epoch_factor", float(epoch_factor))
        object.__setattr__(self, "long_cycle_factors", long_factors)
        object.__setattr__(self, "short_cycle_factors",
                           tuple(_factor("short_cycle_factors", f) for f in self.short_cycle_factors))


class MultigridSchedule:
    """The long/short-cycle schedule of multigrid training, as a list of stages.

    Args:
        base_batch_size: batch size of the full shape, per process (what you would give
            ``DataLoader(batch_size=...)``); every batch size below is a multiple of it.
        num_frames: ``T`` of the full shape (frames per clip).
        crop_size: ``S`` of the full shape (side of the square crop).
        lr_steps: epochs at which each learning-rate stage starts, first ``0``
            (SlowFast's ``SOLVER.STEPS``, e.g. ``[0, 94, 154, 196]``).
        max_epoch: length of the ordinary (non-multigrid) schedule, e.g. ``239``.
        cycles: a ``CycleOptions`` holding the five options below; they may also be given as
            keywords, which override its own.
        long_cycle: run the long cycle (shape changes every few epochs).
        short_cycle: run the short cycle (crop changes every iteration).
        long_cycle_factors: ``(t, s)`` per long-cycle shape: ``T' = round(T t)``,
            ``S' = round(S s)``; the last must be ``(1, 1)`` (the full shape).
        short_cycle_factors: crop fractions of the short cycle's smaller iterations.
        epoch_factor: the whole multigrid schedule lasts ``max_epoch * epoch_factor`` epochs
            (multigrid epochs are cheaper; 1.5 in the paper). Ignored when both cycles are off.
        sampling_rate: frame interval of the full shape; a shape with fewer frames samples
            them ``num_frames // T'`` times further apart, so a clip spans the same time.

    Attributes:
        plan: the stages in order, each a dict with ``start_epoch`` (inclusive),
            ``end_epoch`` (exclusive), ``batch_size``, ``num_frames``, ``crop_size``,
            ``sampling_rate`` and ``lr_multiplier`` (the long-cycle shape, per process), plus
            ``lr_stage`` (index into ``lr_steps`` given), ``fine_tune`` and ``short_cycle``
            (the ``(batch_size, crop_size)`` of each short-cycle iteration, in order; one
            entry, the stage's own shape, when the short cycle is off).
        total_epochs: number of epochs to train (the end of the last stage).
        lr_steps: epochs at which the learning rate changes (SlowFast's rewritten
            ``SOLVER.STEPS``): every stage start plus the middle of the fine-tune stage.

    How the long cycle is laid out (SlowFast's ``get_long_cycle_schedule``): inside each
    learning-rate stage of ``E`` epochs the long-cycle shapes get epochs in proportion to
    their average batch multiplier ``a_i`` (averaged over the short cycle), ``E a_i / sum(a)``,
    so each shape gets the same number of iterations. The fine-tune stage gets the last
    ``max_epoch - lr_steps[-1]`` epochs shrunk by the same iteration saving. All epoch
    counts are then scaled so the total is ``max_epoch * epoch_factor``, and each stage
    boundary is the *cumulative* epoch count rounded with Python's ``round()`` (half to even:
    with the SlowFast Kinetics numbers the total is exactly 358.5, which gives 358). packer
    does this arithmetic in exact fractions, SlowFast in floats; they agree except on a
    float that lands a hair off a .5 tie. The batch multiplier of a shape is
    ``round(T S^2 / (T' S'^2))`` (4 x 158^2 -> 8.04 -> 8).
    """

    def __init__(self, base_batch_size: int, num_frames: int, crop_size: int,
                 lr_steps: Sequence[int], max_epoch: int, *, sampling_rate: int = 1,
                 cycles: CycleOptions | None = None, **cycle_fields: Any):
        self.base_batch_size = _positive_int("base_batch_size", base_batch_size)
        self.num_frames = _positive_int("num_frames", num_frames)
        self.crop_size = _positive_int("crop_size", crop_size)
        self.max_epoch = _positive_int("max_epoch", max_epoch)
        self.sampling_rate = _positive_int("sampling_rate", sampling_rate)
        steps = [int(s) for s in lr_steps]
        if not steps or steps[0] != 0 or any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"lr_steps must start at 0 and increase strictly, not {list(lr_steps)!r}")
        if steps[-1] >= self.max_epoch:
            raise ValueError(f"lr_steps {steps} must all be before max_epoch={self.max_epoch}")
        cycles = dataclasses.replace(cycles, **cycle_fields) if cycles is not None else CycleOptions(**cycle_fields)
        if cycles.long_cycle and len(steps) < 2:
            raise ValueError("the long cycle needs at least two lr_steps (the last one starts "
                             f"the fine-tune stage), not {steps}")
        self.cycles = cycles
        self.base_lr_steps = steps
        self.long_cycle = cycles.long_cycle
        self.short_cycle = cycles.short_cycle
        self.epoch_factor = cycles.epoch_factor
        self.long_cycle_factors = cycles.long_cycle_factors
        self.short_cycle_factors = cycles.short_cycle_factors
        self.plan: list[dict[str, Any]] = self._build_plan()
        self.total_epochs: int = self.plan[-1]["end_epoch"]
        starts = [s["start_epoch"] for s in self.plan]
        if self.plan[-1]["fine_tune"]:
            starts.append((self.plan[-1]["start_epoch"] + self.plan[-1]["end_epoch"]) // 2)
        self.lr_steps: list[int] = sorted(set(starts))
        log.debug("multigrid schedule:\n%s", self.describe())

    # -- building --------------------------------------------------------------------------
    def _shape(self, t_factor: float, s_factor: float) -> dict[str, Any]:
        """One long-cycle shape (per process) with its short cycle."""
        frames = int(round(self.num_frames * t_factor))
        side = int(round(self.crop_size * s_factor))
        if frames < 1 or side < 1:
            raise ValueError(f"long-cycle factors ({t_factor}, {s_factor}) give an empty clip "
                             f"({frames} frames of {side} px) for num_frames={self.num_frames}, "
                             f"crop_size={self.crop_size}")
        multiplier = max(1, round(self.num_frames * self.crop_size ** 2 / (frames * side ** 2)))
        batch = self.base_batch_size * multiplier
        factors = self.short_cycle_factors if self.short_cycle else ()
        if any(round(f * self.crop_size) < 1 for f in factors):
            raise ValueError(f"short_cycle_factors {factors} give an empty crop for crop_size={self.crop_size}")
        return {"batch_size": batch, "num_frames": frames, "crop_size": side,
                "sampling_rate": self.sampling_rate * max(1, self.num_frames // frames),
                "lr_multiplier": multiplier,
                "short_cycle": _short_cycle_phases(batch, side, self.crop_size, factors)}

    def _build_plan(self) -> list[dict[str, Any]]:
        full = self._shape(1.0, 1.0)
        steps = self.base_lr_steps
        if not self.long_cycle:
            # SlowFast (short cycle only) truncates the stretched steps with int(); with
            # neither cycle nothing is stretched.
            factor = self.epoch_factor if self.short_cycle else 1.0
            starts = [int(s * factor) for s in steps]
            ends = starts[1:] + [int(self.max_epoch * factor)]
            stages = [dict(full, lr_stage=i, fine_tune=False, start_epoch=a, end_epoch=b)
                      for i, (a, b) in enumerate(zip(starts, ends))]
            return self._finish(stages)

        shapes = [self._shape(t, s) for t, s in self.long_cycle_factors]
        # Average batch multiplier of each shape over its short cycle, exactly.
        avg = [Fraction(sum(b for b, _ in sh["short_cycle"]), self.base_batch_size * len(sh["short_cycle"]))
               for sh in shapes]
        raw: list[tuple[int, dict[str, Any], Fraction]] = []  # (lr stage, shape, epochs)
        iterations = Fraction(0)  # in units of (samples / base batch)
        for stage, (start, end) in enumerate(zip(steps, steps[1:])):
            for shape, a in zip(shapes, avg):
                epochs = (end - start) * a / sum(avg)
                iterations += epochs / a
                raw.append((stage, shape, epochs))
        saving = Fraction(steps[-1]) / iterations
        raw.append((len(steps) - 1, full, (self.max_epoch - steps[-1]) / saving * avg[-1]))
        scale = Fraction(self.max_epoch) * Fraction(self.epoch_factor) / sum(e for _, _, e in raw)
        stages, cumulative, start_epoch = [], Fraction(0), 0
        for i, (stage, shape, epochs) in enumerate(raw):
            cumulative += epochs * scale
            end_epoch = round(cumulative)
            stages.append(dict(shape, lr_stage=stage, fine_tune=i == len(raw) - 1,
                               start_epoch=start_epoch, end_epoch=end_epoch))
            start_epoch = end_epoch
        return self._finish(stages)

    @staticmethod
    def _finish(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Order the keys, drop stages that rounded to zero epochs."""
        keys = ("start_epoch", "end_epoch", "batch_size", "num_frames", "crop_size", "sampling_rate",
                "lr_multiplier", "lr_stage", "fine_tune", "short_cycle")
        kept = [{k: s[k] for k in keys} for s in stages if s["end_epoch"] > s["start_epoch"]]
        if not kept:
            raise ValueError("the schedule has no epochs: raise max_epoch or epoch_factor")
        return kept

    # -- queries ---------------------------------------------------------------------------
    def stage_index(self, epoch: int) -> int:
        """Index in ``plan`` of the stage in force at ``epoch`` (the last one past the end)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        for i, stage in enumerate(self.plan):
            if epoch < stage["end_epoch"]:
                return i
        return len(self.plan) - 1

    def at(self, epoch: int) -> dict[str, Any]:
        """The stage in force at ``epoch`` (a copy of its ``plan`` entry)."""
        stage = self.plan[self.stage_index(epoch)]
        return dict(stage, short_cycle=list(stage["short_cycle"]))

    def lr_at(self, epoch: int, gamma: float = 0.1) -> float:
        """Learning rate at ``epoch`` relative to the base one: ``gamma ** stage * multiplier``.

        SlowFast's ``steps_with_relative_lrs`` policy: each long-cycle shape scales the
        learning rate of its learning-rate stage by its batch multiplier; the fine-tune
        stage keeps the previous stage's learning rate for its first half
        (``(start + end) // 2``) and decays once more for the second half.
        """
        stage = self.plan[self.stage_index(epoch)]
        decays = stage["lr_stage"]
        if stage["fine_tune"] and epoch < (stage["start_epoch"] + stage["end_epoch"]) // 2:
            decays -= 1
        return gamma ** decays * stage["lr_multiplier"]

    def iterations(self, num_samples: int, *, num_replicas: int = 1, drop_last: bool = False) -> list[int]:
        """Iterations (batches per process) of each stage of ``plan`` over ``num_samples`` samples.

        Counts exactly what ``MultigridBatchSampler`` yields: each process gets
        ``ceil(num_samples / num_replicas)`` samples an epoch, batched through the short cycle.
        """
        per_rank = math.ceil(num_samples / num_replicas)
        return [(s["end_epoch"] - s["start_epoch"])
                * count_batches(per_rank, [b for b, _ in s["short_cycle"]], drop_last)
                for s in self.plan]

    def relative_cost(self) -> float:
        """Compute of the whole schedule as a fraction of plain training (``max_epoch`` epochs
        at the full shape), counting a clip's cost as ``T x S^2`` (a 3D CNN's FLOPs).

        Each epoch sees every sample once; within a stage a sample's expected ``S^2`` is the
        short cycle's, weighted by batch size. ``1 / relative_cost()`` is the FLOP-equivalent
        speedup: 3.4x for the SlowFast Kinetics schedule (8 x 16 x 224^2, steps 0/94/154/196,
        239 epochs), 1.6x for its short cycle alone, 2.2x for its long cycle alone.
        """
        full = self.num_frames * self.crop_size ** 2
        total = Fraction(0)
        for s in self.plan:
            per_sample = Fraction(sum(b * c * c for b, c in s["short_cycle"]), sum(b for b, _ in s["short_cycle"]))
            total += (s["end_epoch"] - s["start_epoch"]) * s["num_frames"] * per_sample
        return float(total / (self.max_epoch * full))

    def describe(self) -> str:
        """The plan as a small text table (one line per stage)."""
        lines = ["epochs      T   S    B   lr x  rate  short cycle (B x S)"]
        for s in self.plan:
            cycle = ", ".join(f"{b}x{c}" for b, c in s["short_cycle"])
            tag = "  fine-tune" if s["fine_tune"] else ""
            lines.append(f"{s['start_epoch']:>4}-{s['end_epoch']:<4} {s['num_frames']:>3} "
                         f"{s['crop_size']:>4} {s['batch_size']:>4} {s['lr_multiplier']:>4} "
                         f"{s['sampling_rate']:>5}  {cycle}{tag}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"MultigridSchedule(base_batch_size={self.base_batch_size}, num_frames={self.num_frames}, "
                f"crop_size={self.crop_size}, lr_steps={self.base_lr_steps}, max_epoch={self.max_epoch}, "
                f"long_cycle={self.long_cycle}, short_cycle={self.short_cycle}, "
                f"epoch_factor={self.epoch_factor}) -> {len(self.plan)} stages, {self.total_epochs} epochs")
