"""Downloading one remote file into place: retries with backoff on transient faults, a bounded
budget, and a sha256/size check before the file is renamed into place.

Transient (retried): timeouts, connection resets and other transport errors, HTTP 5xx/429,
and a download whose size or sha256 differs from the manifest's (truncated or altered on the
way). Permanent (raised at once): a missing object (``RemoteMissing``, a PackerError naming
the URL) and refused access. Every message names the URL redacted, never a credential.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from packer.errors import CorruptData, PackerError
from packer.fileio import file_sha256
from packer.remote.url import redact, scrub

__all__ = ["RetryPolicy", "FetchStats", "RemoteError", "RemoteMissing", "fetch_file", "file_sha256",
           "is_transient", "retrying", "http_status"]

log = logging.getLogger(__name__)


class RemoteError(PackerError):
    """A remote object could not be read or written (after the retries, or not retryable)."""


class RemoteMissing(RemoteError):
    """A remote object does not exist."""


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: ``attempts`` per file, exponential backoff from ``backoff`` seconds
    (doubling, jittered, at most ``max_backoff``), and no new attempt after ``budget`` seconds."""

    attempts: int = 6
    backoff: float = 0.2
    max_backoff: float = 5.0
    budget: float = 300.0
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.backoff < 0 or self.max_backoff < 0 or self.budget <= 0 or self.timeout <= 0:
            raise ValueError("RetryPolicy: attempts >= 1, backoff/max_backoff >= 0, budget/timeout > 0")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (attempt counts from 1)."""
        return min(self.max_backoff, self.backoff * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)


@dataclass
class FetchStats:
    """What one fetch did: attempts made, retries for transport faults and for bad content."""

    attempts: int = 0
    retries: int = 0
    refetches: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)


_LOCAL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES}


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (aiohttp, botocore, fsspec), or None."""
    for name in ("status", "status_code", "code"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(value, int):
            return value
    return None


def is_transient(exc: BaseException) -> bool:
    """True for faults worth another try: timeouts, resets, transport errors, HTTP 5xx/429."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, OSError) and exc.errno in _LOCAL_ERRNOS:  # our own disk: no retry helps
        return False
    status = http_status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, ConnectionError)):
        return True
    try:
        import aiohttp

        if isinstance(exc, aiohttp.ClientError):
            return True
    except ImportError:  # pragma: no cover
        pass
    return isinstance(exc, OSError)


def retrying(what: str, fn: Callable[[], Any], *, policy: RetryPolicy, secrets: list[str],
             stats: FetchStats | None = None) -> Any:
    """``fn()`` retried on transient faults under ``policy``; ``what`` (a redacted URL) names it."""
    stats = stats if stats is not None else FetchStats()
    deadline = time.monotonic() + policy.budget
    attempt = 0
    while True:
        attempt += 1
        stats.attempts += 1
        try:
            return fn()
        except PackerError:  # fn's own verdict (e.g. OutputChanged): not a transport fault
            raise
        except FileNotFoundError:
            raise RemoteMissing(f"{what}: not found (no such object on the server)") from None
        except PermissionError as e:
            raise RemoteError(f"{what}: access refused ({scrub(str(e), secrets) or type(e).__name__})") from e
        except Exception as e:  # noqa: BLE001 - classified below; the original never leaks secrets
            reason = f"{type(e).__name__}: {scrub(str(e), secrets)}".rstrip(": ")
            if http_status(e) == 404:
                raise RemoteMissing(f"{what}: not found (HTTP 404)") from e
            if not is_transient(e):
                raise RemoteError(f"{what}: {reason}") from e
            stats.errors.append(reason)
            if attempt >= policy.attempts or time.monotonic() + policy.delay(attempt) > deadline:
                raise RemoteError(f"{what}: gave up after {attempt} attempts ({reason})") from e
            stats.retries += 1
            wait = policy.delay(attempt)
            log.warning("%s: %s; retry %d of %d in %.2fs", what, reason, attempt, policy.attempts - 1, wait)
            time.sleep(wait)


def fetch_file(fs: Any, rpath: str, dest: Path, *, url: str, sha256: str | None = None,
               size: int | None = None, policy: RetryPolicy = RetryPolicy(), secrets: list[str] = (),
               stats: FetchStats | None = None, changed: Callable[[], None] | None = None,
               landing: Callable[[Path], None] | None = None) -> FetchStats:
    """Download ``rpath`` to ``dest`` atomically (a temporary file beside it, checked, renamed).

    ``sha256``/``size`` (from the manifest) are checked before the rename; a mismatch is
    fetched again within the policy, then CorruptData naming the URL. ``changed()`` runs on the
    first mismatch and raises (OutputChanged) when the dataset was republished since the
    manifest was read: then the file is not damaged, it is another version's. ``landing(tmp)``
    runs on the checked file just before it is renamed into place (to record the check first).
    """
    stats = stats if stats is not None else FetchStats()
    what = redact(url)
    tmp = dest.with_name(f".{dest.name}.download-{os.getpid()}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    bad = 0
    try:
        while True:
            retrying(what, lambda: fs.get_file(rpath, str(tmp)), policy=policy, secrets=list(secrets), stats=stats)
            got = tmp.stat().st_size
            problem = None
            if size is not None and got != size:
                problem = f"{got} bytes, the manifest says {size} (truncated or altered download)"
            elif sha256 and file_sha256(tmp) != sha256:
                problem = "sha256 differs from the manifest's (altered download)"
            if problem is None:
                if landing is not None:
                    landing(tmp)
                os.replace(tmp, dest)
                stats.bytes += got
                return stats
            if bad == 0 and changed is not None:
                changed()
            bad += 1
            stats.errors.append(problem)
            if bad >= policy.attempts:
                raise CorruptData(what, f"{problem}; still wrong after {bad} downloads")
            stats.refetches += 1
            log.warning("%s: %s; fetching again", what, problem)
            time.sleep(policy.delay(bad))
    finally:
        tmp.unlink(missing_ok=True)
