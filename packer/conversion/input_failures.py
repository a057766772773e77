"""Input lines and entries that cannot become items: recorded, never dropped.

Every parser of inputs (``packer.conversion.inputs``, ``packer.conversion.lists``) takes
``failures: list[InputFailure] | None``: with a list, it appends one ``InputFailure`` per
unusable line (no label, an unsafe path, another extension, a repeated path, ...) and goes on;
with None (a library caller that wants the old strictness) it raises ``UsageError``.
:func:`bad_line` does both. The command passes the list to ``runner.run(input_failures=...)``,
which writes each to ``failures.jsonl`` with stage ``input`` and counts it like any failure.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from packer.errors import UsageError

__all__ = ["InputFailure", "bad_line"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputFailure:
    """An input line or directory entry that cannot become an item: recorded in
    ``failures.jsonl`` with stage ``input`` (never dropped silently).

    The mechanism for every parser: take ``failures: list[InputFailure] | None``; with a list,
    append one of these per unusable line and go on; with None (a library caller that wants
    the old strictness), raise ``UsageError(str(failure))``. :func:`bad_line` does both. The
    command passes the list to ``runner.run(input_failures=...)``, which records and counts them.
    """

    file: str  # the list/CSV file, or the folder an entry was found in
    line: int  # 1-based line number (0 for a directory entry)
    reason: str
    key: str = ""  # the path the line names, when it could be read

    def record(self) -> dict:
        """The ``failures.jsonl`` record (``source`` is the file, plus its line number)."""
        return {"key": self.key, "source": self.file, "stage": "input", "reason": self.reason,
                "file": self.file, "line": self.line}

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}" if self.line else f"{self.file}: {self.reason}"


def bad_line(failures: list[InputFailure] | None, file: str, line: int, reason: str, key: str = "") -> None:
    """Record an unusable input line in ``failures``, or raise UsageError without a list."""
    bad = InputFailure(str(file), line, reason, key)
    if failures is None:
        raise UsageError(str(bad))
    log.warning("%s (recorded in failures.jsonl)", bad)
    failures.append(bad)
