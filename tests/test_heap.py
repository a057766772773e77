"""``packer.heap.tune_heap``: a freed buffer's pages are reused, not faulted in again."""
from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from packer.heap import tune_heap

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt thresholds are glibc's")

_LOOP = """
import resource, sys
from packer.heap import tune_heap
if sys.argv[1] == "1":
    assert tune_heap()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):  # a commit's worth of 60 kB values, allocated, then all freed at the commit
    batch = [bytearray(60_000) for _ in range(200)]
    del batch
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(tuned: bool) -> int:
    out = subprocess.run([sys.executable, "-c", _LOOP, "1" if tuned else "0"], capture_output=True, text=True,
                         check=True)
    return int(out.stdout)


def test_a_tuned_process_reuses_freed_buffers():
    untuned, tuned = _faults(False), _faults(True)
    assert untuned > 9 * 200 * 14  # the freed batch goes back to the kernel, faulted in again each round
    assert tuned < untuned // 5  # only the first round faults


def test_tune_heap_is_idempotent():
    assert tune_heap() and tune_heap()


def test_collector_paused_pauses_and_restores_the_collector():
    import gc

    from packer.heap import collector_paused

    assert gc.isenabled()
    with pytest.raises(KeyError):
        with collector_paused():
            assert not gc.isenabled()
            raise KeyError("an error inside still restores it")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a collector paused by the caller stays paused
    finally:
        gc.enable()
