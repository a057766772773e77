"""Exceptions raised by packer. Every error names the file and what is wrong."""
from __future__ import annotations

from typing import Any

__all__ = [
    "PackerError",
    "UsageError",
    "CorruptSample",
    "CorruptData",
    "FormatError",
    "WriteError",
    "ResumeRefused",
    "OutputClaimed",
    "OutputChanged",
    "TooManyFailures",
    "VerifyFailed",
]


class PackerError(Exception):
    """Base class of every error packer raises on purpose."""


class UsageError(PackerError):
    """Bad arguments, caught before any work starts."""


class ResumeRefused(UsageError):
    """``--resume`` of an output made with other options or inputs (one line per difference);
    the command exits with status 2, like a usage error, and the output is left untouched."""

    exit_code = 2


class CorruptSample(PackerError):
    """One input sample cannot be read or decoded (skipped and recorded during conversion)."""

    def __init__(self, key: str, source: str, reason: str, stage: str = "decode"):
        self.key = key
        self.source = source
        self.reason = reason
        self.stage = stage
        super().__init__(f"{source}: {reason}")


class CorruptData(PackerError):
    """Packed data on disk is damaged: bad magic, CRC mismatch, truncation, missing key."""

    def __init__(self, path: str, reason: str, *, key: str | None = None, position: object = None):
        self.path = str(path)
        self.reason = reason
        self.key = key
        self.position = position
        where = self.path
        if position is not None:
            where += f" at {position}"
        if key is not None:
            where += f" (key {key!r})"
        super().__init__(f"{where}: {reason}")


class FormatError(PackerError):
    """The path is not a packed dataset packer can read (unknown format or version)."""


class WriteError(PackerError):
    """Writing the output failed (disk full, permissions); names the path."""


class OutputClaimed(PackerError):
    """Another run holds the output (or wrote into this run's partial output); exit status 2."""

    exit_code = 2


class OutputChanged(PackerError):
    """A packed output was replaced (``--overwrite``) or removed after a reader opened it."""

    def __init__(self, path: str, reason: str = "replaced or removed since this dataset was opened "
                                                "(an --overwrite?); open it again to read the new version"):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class TooManyFailures(PackerError):
    """A conversion finished (its output is published) with more failed inputs than
    ``max_failures`` allows; ``report`` is its Report (failures listed in ``failures.jsonl``)."""

    exit_code = 1

    def __init__(self, report: Any, max_failures: int):
        self.report = report
        self.max_failures = max_failures
        super().__init__(f"{report.failed} inputs failed (--max-failures {max_failures})")


class VerifyFailed(PackerError):
    """``verify`` found problems; ``result`` lists them (``result.problems``)."""

    exit_code = 1

    def __init__(self, result: Any):
        self.result = result
        super().__init__(f"{result.path}: {len(result.problems)} problems in {result.count} samples")
