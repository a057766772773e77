"""The suite's own check that it leaves no process behind (tests/conftest.py,
tests/support/processes.py): a session whose test leaves processes running, a child and an
orphan (its parent gone), fails, names them, and they are gone."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO
from scripts.timing import scaled

LEAKY = '''
import os, subprocess, sys, time

def test_leaves_two_behind(tmp_path_factory):
    pids = os.environ["LEFT_PIDS"]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    r, w = os.pipe()
    if os.fork() == 0:  # an orphan: its parent exits at once
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            time.sleep(600)
        os._exit(0)
    orphan = os.read(r, 32).decode()
    open(pids, "w").write(f"{child.pid} {orphan}")
'''


def test_a_session_that_leaves_processes_fails_and_ends_them(tmp_path):
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    pids = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(REPO), "LEFT_PIDS": str(pids)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-n", "2", "-q",
                        "-p", "no:cacheprovider", "test_leaky.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(300))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 passed" in r.stdout and "processes left behind" in r.stdout, r.stdout
    for pid in pids.read_text().split():
        assert f"pid {pid} " in r.stdout, r.stdout
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone
        assert state == "Z", f"{pid} still runs"  # killed, not yet reaped by its parent
