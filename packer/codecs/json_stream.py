"""Read a large JSON object member by member, its big arrays element by element.

``json.load`` of a COCO annotation file holds the whole text and then every parsed object at
once (a 300 MB file becomes over 2 GB of dicts, lists and floats). ``object_members(f,
stream=...)`` reads the top-level object of a text file through a bounded buffer and yields
its members in file order: ``(key, value)`` for a member decoded whole, and ``(key,
Elements)`` for a member named in ``stream`` whose value is an array, an iterator over its
elements, each decoded on its own (the stdlib decoder's ``raw_decode`` at an offset of the
buffer: the same values ``json.load`` gives). Only the buffer and one element are held at a
time. An ``Elements`` not read to its end is skipped (still checked) when the next member is
asked for.

The text must be one JSON object and nothing else; anything that ``json.loads`` refuses (and a
repeated top-level key, whose value ``json.load`` would silently replace) is a ``ValueError``
naming the character offset.
"""
from __future__ import annotations

import json
import re
from typing import Any, Collection, Iterator, TextIO

__all__ = ["object_members", "Elements"]

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
CHUNK = 1 << 20  # characters read at a time


class _Text:
    """A window onto a text file: ``buf[pos:]`` is what is not consumed yet, ``base`` the
    offset in the file of ``buf[0]``."""

    def __init__(self, f: TextIO, chunk: int):
        self.f, self.chunk = f, chunk
        self.buf, self.pos, self.base, self.eof = "", 0, 0, False

    def fill(self, want: int) -> bool:
        """Read at least ``want`` more characters (fewer at the end); False at the end."""
        if self.eof:
            return False
        data = self.f.read(max(want, self.chunk))
        if not data:
            self.eof = True
            return False
        self.base += self.pos
        self.buf = self.buf[self.pos:] + data
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character that is not whitespace (not consumed); '' at the end."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill(self.chunk):
                return ""

    def expect(self, chars: str, what: str) -> str:
        """Consume the next character, one of ``chars``; ValueError saying ``what`` was expected."""
        c = self.peek()
        if not c or c not in chars:
            raise self.error(f"Expecting {what}", self.pos)
        self.pos += 1
        return c

    def value(self) -> Any:
        """Decode the value at the current position. The buffer is refilled until the value
        is followed by what may follow a value (``,``, ``]``, ``}`` or ``:``, after any
        whitespace) or the file ends: a number cut by the buffer's end (``10`` of ``10.5``)
        would otherwise decode short. Each refill asks for as much again as the buffer holds,
        so a value of any size costs linear time."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if self.fill(len(self.buf)):
                    continue
                raise self.error(e.msg, e.pos) from None
            after = _WS.match(self.buf, end).end()  # type: ignore[union-attr]
            if (after < len(self.buf) and self.buf[after] in ",]}:") or not self.fill(len(self.buf)):
                self.pos = end
                return value

    def error(self, msg: str, pos: int) -> ValueError:
        return ValueError(f"{msg} at character {self.base + pos}")


class Elements:
    """The elements of one streamed array, decoded one at a time (see the module doc)."""

    def __init__(self, text: _Text):
        self._text = text
        self._done = text.peek() == "]"
        if self._done:
            text.pos += 1
        self._first = True

    def __iter__(self) -> "Elements":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        text = self._text
        if not self._first and text.expect(",]", "',' delimiter") == "]":
            self._done = True
            raise StopIteration
        self._first = False
        return text.value()

    def skip(self) -> None:
        """Read (and so check) the rest of the array."""
        for _ in self:
            pass


def object_members(f: TextIO, *, stream: Collection[str] = (), chunk: int | None = None) -> Iterator[tuple[str, Any]]:
    """The members of the JSON object that is the whole of ``f``, in file order (see the module
    doc): ``(key, value)``, or ``(key, Elements)`` for a key in ``stream`` whose value is an
    array. ``chunk``: characters read at a time (None: ``CHUNK``). ValueError when the text is
    not one JSON object or repeats a top-level key."""
    text = _Text(f, chunk or CHUNK)
    text.expect("{", "'{' (the file is not a JSON object)")
    seen: set[str] = set()
    if text.peek() == "}":
        text.pos += 1
    else:
        while True:
            if text.peek() != '"':
                raise text.error("Expecting property name enclosed in double quotes", text.pos)
            at = text.pos
            key = text.value()
            if key in seen:
                raise text.error(f"the key {key!r} appears twice", at)
            seen.add(key)
            text.expect(":", "':' delimiter")
            if key in stream and text.peek() == "[":
                text.pos += 1
                elements = Elements(text)
                yield key, elements
                elements.skip()
            else:
                yield key, text.value()
            if text.expect(",}", "',' delimiter") == "}":
                break
    if text.peek():
        raise text.error("Extra data", text.pos)
