"""Lose pebble's race between a worker's death and its acknowledgement, every time.

A pebble pool learns which task a worker took from the worker's acknowledgement, read on one
thread of the pool, and sees the worker die on another. On a busy machine the death can be seen
first (the worker takes a task and dies at once, the reading thread has not run yet): the run
then hung or lost its whole pool (packer.conversion.executors.local). :func:`late_acknowledgements`
makes that order certain: the acknowledgement of a worker that announces itself as dying (it
writes its pid to ``pidfile`` before it dies) is handed to the pool only once the pool has seen
that worker die and started another; every other message is read as it comes.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from scripts.timing import scaled

__all__ = ["late_acknowledgements", "die_on"]


def die_on(pidfile: Path, key: str, how: str, item: str) -> str:
    """The work of one item: for ``key``, write this worker's pid to ``pidfile`` and end it
    (``how``: "SIGKILL", or "exit" with status 3); any other item takes a second (it is still
    running when the dying worker goes)."""
    if item == key:
        pidfile.write_text(str(os.getpid()))
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)
    return item


def late_acknowledgements(pool: Any, pidfile: Path) -> None:
    """Before ``pool`` starts (its first task), hold back the acknowledgements of workers that
    announce their death in ``pidfile`` until the pool has seen them die (see the module text)."""
    manager = pool._pool_manager
    receive = manager.worker_manager.receive

    def dying_pid() -> int | None:
        try:
            return int(pidfile.read_text())
        except (OSError, ValueError):
            return None

    def held_receive(timeout: float) -> Any:
        message = receive(timeout)
        if type(message).__name__ != "Acknowledgement":
            return message
        deadline = time.monotonic() + scaled(5)
        while time.monotonic() < deadline:  # the task it acknowledged starts now: is it the dying one?
            if dying_pid() == message.worker:
                break
            if dying_pid() is not None and os.path.exists(f"/proc/{message.worker}"):
                return message  # another worker's
            time.sleep(0.005)
        else:
            return message
        while message.worker in manager.worker_manager.workers and time.monotonic() < deadline:
            time.sleep(0.005)  # until the pool's other thread has seen the death (and replaced the worker)
        return message

    manager.worker_manager.receive = held_receive
