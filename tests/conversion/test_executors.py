"""Executors: the isolated local mode contains real hangs and real segfaults to one item."""
from __future__ import annotations

import faulthandler
import os
import signal
import time

import pytest

from packer.errors import UsageError
from packer.conversion.executors import InlineExecutor, IsolatedExecutor, LocalExecutor, make_executor
from scripts.timing import scaled


def work(x):
    """Doubles ints; 'hang' sleeps, 'segv' segfaults, 'exit' quits, 'raise' raises."""
    if x == "hang":
        time.sleep(3600)  # far past every (scaled) bound below: waiting for it would show
    if x == "segv":
        faulthandler.disable()  # pytest's traceback dump from the dying child is only noise
        os.kill(os.getpid(), signal.SIGSEGV)
    if x == "exit":
        os._exit(3)
    if x == "raise":
        raise ValueError("bad input")
    return x * 2


def test_hang_and_segfault_cost_one_item_each():
    items = [1, "hang", 2, "segv", 3, "exit", "raise", 4, 5]
    with IsolatedExecutor(workers=2, timeout=1.0) as ex:
        out = list(ex.map(work, items))
    assert [o.value for o in out if o.ok] == [2, 4, 6, 8, 10]
    bad = {items[i]: (o.stage, o.reason) for i, o in enumerate(out) if not o.ok}
    assert bad["hang"][0] == "timeout" and "1s" in bad["hang"][1]
    assert bad["segv"] == ("crash", "worker process died (killed by SIGSEGV)")
    assert bad["exit"] == ("crash", "worker process died (exited with status 3)")
    assert bad["raise"] == ("internal", "ValueError: bad input")


def test_order_kept_and_pool_reusable_after_abandoned_map():
    with IsolatedExecutor(workers=2, timeout=30) as ex:
        assert [o.value for o in ex.map(work, range(20))] == [2 * i for i in range(20)]
        g = ex.map(work, [1, "hang", 2])
        assert next(g).value == 2
        g.close()  # the consumer stopped early: the hanging worker is replaced, not waited for
        t = time.monotonic()
        assert [o.value for o in ex.map(work, [7, 8])] == [14, 16]
        assert time.monotonic() - t < scaled(20)  # not waiting for the hung worker


def test_single_worker_still_isolated():
    with IsolatedExecutor(workers=1, timeout=None) as ex:
        out = list(ex.map(work, ["segv", 1]))
    assert out[0].stage == "crash" and out[1].value == 2


def test_make_executor_modes():
    with make_executor("local", workers=1, timeout=5) as ex:
        assert isinstance(ex, IsolatedExecutor) and ex.timeout == 5
    with make_executor("local", workers=2, isolate=True) as ex:
        assert isinstance(ex, IsolatedExecutor) and ex.timeout is None
    with make_executor("local", workers=0, timeout=5) as ex:
        assert isinstance(ex, InlineExecutor)
    with make_executor("local", workers=2) as ex:
        assert isinstance(ex, LocalExecutor)
    with pytest.raises(UsageError):
        make_executor("local", workers=1, timeout=0)
    with pytest.raises(ValueError):
        IsolatedExecutor(workers=0)


@pytest.mark.parametrize("chunk_size", [1, 4])
def test_local_pool_survives_dead_workers(chunk_size):
    """multiprocessing.Pool lost a dead worker's task and hung forever; now the item that
    killed its worker fails (with the signal or exit status) and everything else comes back."""
    items = [1, "segv", 2, 3, "exit", 4, 5, 6, 7, "raise", 8]
    t = time.monotonic()
    with LocalExecutor(workers=2, chunk_size=chunk_size) as ex:
        out = list(ex.map(work, items))
        assert [o.value for o in ex.map(work, range(5))] == [0, 2, 4, 6, 8]  # still usable
    assert time.monotonic() - t < scaled(60)  # a hang would hit it
    assert [o.value for o in out if o.ok] == [2, 4, 6, 8, 10, 12, 14, 16]
    bad = {items[i]: (o.stage, o.reason) for i, o in enumerate(out) if not o.ok}
    assert bad == {"segv": ("crash", "worker process died (killed by SIGSEGV)"),
                   "exit": ("crash", "worker process died (exited with status 3)"),
                   "raise": ("internal", "ValueError: bad input")}
