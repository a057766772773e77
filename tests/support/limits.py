"""Run ``packer`` under the operating system's limits: a file-size cap, a read-only output."""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
from typing import Callable

import pytest
from tests.support.killing import packer_cmd, packer_env


__all__ = ["file_size_limit", "readonly_cmd", "run_readonly"]


def file_size_limit(limit: int) -> Callable[[], None]:
    """A ``preexec_fn`` capping every file the process writes at ``limit`` bytes (EFBIG past it)."""
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def readonly_cmd(argv: list[str]) -> list[str]:
    """``argv`` run so that directory permissions bind (as root: without CAP_DAC_OVERRIDE)."""
    cmd = packer_cmd(*argv)
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permissions cannot be enforced")
        cmd = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", *cmd]
    return cmd


def run_readonly(argv: list[str]) -> subprocess.CompletedProcess:
    """``argv`` run as :func:`readonly_cmd` does, its output captured."""
    return subprocess.run(readonly_cmd(argv), env=packer_env(), capture_output=True, text=True, timeout=120)
