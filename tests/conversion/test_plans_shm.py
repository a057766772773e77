"""``SharedMemoryExecutor``: workers encode, the bytes come back through shared memory.

Real forked workers, a real shared mapping, real LMDB outputs: the samples and their stored
values equal in-process work, in input order, whatever the slot size (a sample too big for its
slot crosses the pipe instead); a view of a slot is never usable after the slot is reused; a
dead worker costs exactly its item."""
from __future__ import annotations

import os
import time

import pytest

from packer.commands.pack_images import ImageJob
from packer.conversion.executors.base import Outcome, call_safely
from packer.conversion.plans.shm import SharedMemoryExecutor, available
from packer.conversion.inputs import image_items
from packer.conversion.runner import WorkResult
from packer.formats.lmdb import LmdbWriter
from packer.formats.records import RecordsWriter
from packer.formats.sample import Sample
from tests.support.inputs import write_image_folder

pytestmark = pytest.mark.skipif(not available(), reason="needs the fork start method")


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    root = write_image_folder(tmp_path_factory.mktemp("shm") / "src", count=40, classes=2, size=(40, 48))
    (root / "class_1" / "img_0021.jpg").write_bytes(b"broken")
    return image_items(root)[0]


def _inline(job, items, prepare):
    out = []
    for item in items:
        o = call_safely(job, item)
        if o.ok:
            o.value.prepared = prepare(o.value)
        out.append(o)
    return out


def _same(got: list[Outcome], want: list[Outcome]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.ok == w.ok and g.stage == w.stage and g.reason == w.reason
        if w.ok:
            assert g.value == w.value  # key, data, fmt, label, shape, extra
            assert bytes(g.value.data) == w.value.data
            assert bytes(g.value.prepared[0]) == w.value.prepared[0] and g.value.prepared[1:] == w.value.prepared[1:]


@pytest.mark.parametrize("prepare", [LmdbWriter.prepare, RecordsWriter.prepare], ids=["datum", "record"])
@pytest.mark.parametrize("slot_bytes", [1 << 20, 3000], ids=["fits", "overflows"])
@pytest.mark.parametrize("views", [True, False])
def test_outcomes_equal_in_process_work_in_input_order(items, prepare, slot_bytes, views):
    job = ImageJob(check="full")
    want = _inline(job, items, prepare)
    got = []
    with SharedMemoryExecutor(workers=2, prepare=prepare, views=views, chunk_size=3, slot_bytes=slot_bytes) as ex:
        for outcome in ex.map(job, items):  # compared before the next one may reuse the slot
            _same([outcome], [want[len(got)]])
            got.append(outcome)
    assert [o.ok for o in got].count(False) == 1
    if views and slot_bytes == 1 << 20:
        assert isinstance(got[0].value.prepared[0], memoryview)
    if not views:
        assert all(isinstance(o.value.data, bytes) for o in got if o.ok)


def test_a_view_is_unusable_once_its_slot_moves_on(items):
    with SharedMemoryExecutor(workers=1, prepare=LmdbWriter.prepare, views=True, chunk_size=4) as ex:
        kept = [o.value.prepared[0] for o in ex.map(ImageJob(check="header"), items) if o.ok]
    with pytest.raises(ValueError):  # released: never another sample's bytes
        bytes(kept[0])


class _Several:
    """A work function whose result is not one sample (a video's frames): shipped whole."""

    def __call__(self, item):
        return WorkResult([Sample(item.key, b"abc", "jpeg", item.label, 1, 1, 3)], entry={"key": item.key})


def test_results_that_are_not_one_sample_cross_whole(items):
    with SharedMemoryExecutor(workers=2, chunk_size=5) as ex:
        got = list(ex.map(_Several(), items))
    assert [o.value.entry["key"] for o in got] == [i.key for i in items]


class _DiesOn:
    def __init__(self, key, linger=0.0):
        self.key, self.linger = key, linger

    def __call__(self, item):
        if item.key == self.key:
            time.sleep(self.linger)
            os._exit(9)
        return ImageJob(check="header")(item)


@pytest.mark.parametrize("at,linger", [(13, 0.0), (1, 0.5)], ids=["mid-run", "head-after-the-others"])
def test_a_dead_worker_costs_its_item_only(items, at, linger):
    """``head-after-the-others``: the range being waited for dies last, after the other worker
    has filled every free slot with finished ranges; its one-item reruns still get slots."""
    victim = items[at].key
    with SharedMemoryExecutor(workers=2, prepare=LmdbWriter.prepare, chunk_size=4) as ex:
        got = [(o.ok, o.stage, o.value.key if o.ok else None) for o in ex.map(_DiesOn(victim, linger), items)]
    assert got[at][:2] == (False, "crash")
    assert [k for ok, _, k in got if ok] == [i.key for i in items if i.key not in (victim, "class_1/img_0021.jpg")]


def test_constructor_validates():
    with pytest.raises(ValueError):
        SharedMemoryExecutor(workers=0)
    with pytest.raises(ValueError):
        SharedMemoryExecutor(workers=1, slot_bytes=0)
