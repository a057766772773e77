"""The run token in a partial output: which run wrote it, checked before it is touched and
at its publish (see ``packer.conversion.claim`` for the claim these tokens come from).

``{journal dir}/.run-token`` (inside ``OUT.partial/``, or in ``OUT.partial.journal/`` beside a
single-file partial) holds the writing run's ``Holder`` plus the partial's device and inode.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from packer.conversion.claim import held
from packer.conversion.holders import Holder
from packer.errors import OutputClaimed, WriteError
from packer.manifest import atomic_write_bytes

__all__ = ["TOKEN_NAME", "adopt_partial", "stamp_partial", "publish_guard"]

log = logging.getLogger(__name__)

TOKEN_NAME = ".run-token"


def _token_file(writer: Any) -> Path:
    return writer._journal_dir() / TOKEN_NAME


def _ident(path: Path) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def adopt_partial(writer: Any) -> None:
    """Before a run touches an existing partial output: it must be this run's, the taken-over
    holder's, or one whose writer is gone; else OutputClaimed names who writes it."""
    claim = held(writer.out)
    tf = _token_file(writer)
    if claim is None or not (writer.workdir.exists() or tf.exists()):
        return
    try:
        data, age = tf.read_bytes(), time.time() - tf.stat().st_mtime
    except OSError:
        return  # a partial without a token: written before claims existed
    owner = Holder.parse(data)
    if owner is None or owner.token in (claim.token, claim.holder.took_over) or owner.is_me():
        return
    why = owner.gone(age)
    if why is None and not claim.break_lock:
        raise OutputClaimed(f"{writer.workdir}: being written by another run ({owner.describe()}) "
                            f"that does not hold the claim on {writer.out}; --break-lock if it is "
                            "certainly gone")
    log.info("%s: partial output of %s (%s); this run takes it over", writer.workdir, owner.describe(),
             why or "--break-lock")


def stamp_partial(writer: Any) -> None:
    """After the writer opened its partial output: record this run's token in it."""
    claim = held(writer.out)
    if claim is None:
        return
    data = claim.holder.to_bytes(partial=_ident(writer.workdir))
    try:
        atomic_write_bytes(_token_file(writer), data)
    except OSError as e:
        raise WriteError(f"{_token_file(writer)}: cannot write the run token ({e.strerror or e})") from None


def publish_guard(writer: Any) -> Callable[[], None]:
    """The publish step's check: this run still holds the claim and the partial carries its
    token (and is the same file or folder it stamped). Removes the token file and returns a
    re-check to call right before the rename. No claim held (a Writer used directly): no check."""
    claim = held(writer.out)
    if claim is None:
        return lambda: None
    claim.check()
    tf = _token_file(writer)
    try:
        stamp = json.loads(tf.read_bytes())
    except (OSError, ValueError):
        stamp = {}
    if stamp.get("token") != claim.token:
        found = f"run token {stamp['token']}" if stamp.get("token") else "no run token"
        raise OutputClaimed(f"{writer.workdir}: not published: it carries {found}, not this run's "
                            f"{claim.token} (another run wrote into it)")
    ident = _ident(writer.workdir)
    if stamp.get("partial") != ident:
        raise OutputClaimed(f"{writer.workdir}: not published: it was replaced since this run "
                            "created it (another run wrote into it)")
    tf.unlink(missing_ok=True)

    def recheck() -> None:
        claim.check()
        if _ident(writer.workdir) != ident:
            raise OutputClaimed(f"{writer.workdir}: not published: it was replaced since this run "
                                "checked it (another run wrote into it)")

    return recheck
