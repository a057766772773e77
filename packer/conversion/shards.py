"""WebDataset tar shards as items: one item per sample, holding where its members lie.

A shard is an uncompressed tar; a **sample** is a run of consecutive members whose names share
the part before the first dot of the base name (webdataset's ``base_plus_ext``:
``cat/0001.jpg`` and ``cat/0001.cls`` are sample ``cat/0001`` with the extensions ``jpg`` and
``cls``, lower-cased). A member's extension names its field:

* an image extension (``--ext``: jpg, jpeg, png, webp, bmp): ``image``;
* ``cls``: ``label``, the class index as text (read while listing: the labels decide the classes);
* any other extension is a field of that name, typed by its last suffix: ``txt`` str, ``json``
  json, ``npy`` a numpy array (dtype and trailing shape from the first sample's header, leading
  dimension free), another image suffix an image (``left.png``), anything else bytes.

The shards are listed (``shard_items``) from their headers: a tar is a sequence of 512-byte
headers each followed by its member's data, so the listing reads the shard in order in 1 MiB
windows (a larger member is skipped by seeking), parses each window's header fields at once
(numpy) and walks the headers through them, keeping each member's offset and size; nothing is
extracted, and an item is the sample's key, label and ``(field, offset, size)`` triples. The
work reads each member with one ``pread`` where it runs. The headers are parsed here rather than
by ``tarfile``, which costs several times as much a member in the single listing process
(``python -m scripts.bench.sources`` prints both); ``tests/conversion/test_shards.py`` checks
the listing against ``tarfile``'s on ustar, GNU and pax archives with long names, and the
samples against what ``webdataset.WebDataset`` reads.

Every sample becomes an item or an ``InputFailure`` naming the shard and the key: a member cut
short by the end of the shard, a link or special file, two members of one sample with the same
extension (webdataset raises on it), a sample without an image where the others have one, a
``.cls`` that is not an integer, a name that cannot be a key (absolute, ``..``); a header whose
checksum is wrong, or data after the end-of-archive marker, is a failure naming the shard and
the offset: the members after it cannot be listed (never dropped in silence, as ``tarfile``
stops there). A shard that cannot be opened is one failure naming it.

A URL shard (``https://``, ``s3://``, anything fsspec reads) is fetched whole into the node
cache first (``$PACKER_CACHE_DIR/sources/``, with the retries of ``packer.remote.fetch``) and read
there; a fetched copy is reused while the object's size and ETag/mtime are unchanged.
"""
from __future__ import annotations

import io
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

from packer.codecs.fields import Schema
from packer.conversion import lists
from packer.conversion.input_failures import InputFailure, bad_line
from packer.conversion.inputs import SourceItem, SourceListing, safe_key
from packer.errors import CorruptSample, UsageError

__all__ = ["TarSample", "Member", "scan_shard", "expand_shards", "shard_items", "split_name", "close_shards",
           "FIELD_TYPES"]

log = logging.getLogger(__name__)

_BLOCK = 512
_WINDOW = 1 << 20
_REGULAR = frozenset(b"0\x007")
_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset.tariterators.base_plus_ext
# a non-image member's type by its last suffix (anything else: bytes)
FIELD_TYPES = {"txt": "str", "text": "str", "json": "json", "npy": "ndarray", "cls": "int"}


def split_name(name: str) -> tuple[str | None, str | None]:
    """``(key, extension)`` of a member name as webdataset splits it (``a/b.seg.png`` ->
    ``("a/b", "seg.png")``); ``(None, None)`` for a name without an extension."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1 and "\n" not in name:  # the usual name, without the pattern's cost
        return name[:dot], name[dot + 1:]
    m = _NAME.match(name)  # (a base name starting with a dot, a newline: the pattern decides)
    return (m.group(1), m.group(2)) if m else (None, None)


class Member(NamedTuple):
    """One tar member as the headers describe it: its name, where its data starts, its size and
    kind (``file``, ``dir``, or why it cannot be read: ``a symbolic link``, ...); ``problem`` is
    set for damage found at ``offset`` (then ``name`` may be empty)."""

    name: str
    offset: int
    size: int
    kind: str = "file"
    problem: str = ""
    data: bytes | None = None  # the member's bytes, when ``scan_shard`` was asked to keep them


def _octal(field: bytes) -> int:
    """A header's numeric field: octal text (up to its first NUL, as ``tarfile`` reads it), or
    GNU base-256 (first byte 0x80/0xff); ValueError when it is neither."""
    try:  # the usual field: digits, then NULs or spaces
        return int(field.rstrip(b"\0 "), 8)
    except ValueError:
        pass
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * (len(field) - 1))) if field[:1] == b"\xff" else value
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax(data: bytes) -> dict[str, str]:
    """The records of a pax extended header (``"%d %s=%s\\n"``) that decide a member: its
    ``path`` and ``size`` (webdataset's TarWriter writes one per member, for its ``mtime``)."""
    if b"path=" not in data and b"size=" not in data:
        return {}
    out, pos = {}, 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space])
        if length <= 0:
            raise ValueError("bad pax record length")
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


_NO_DATA = frozenset(b"123456V")  # (type flags as ints: bytes iterate as ints)
_EXTENDED = frozenset(b"LxgK")
_POW6 = 8 ** np.arange(5, -1, -1, dtype=np.int64)
_POW11 = 8 ** np.arange(10, -1, -1, dtype=np.int64)
_KINDS = {ord("1"): "a hard link", ord("2"): "a symbolic link", ord("3"): "a character device",
          ord("4"): "a block device", ord("6"): "a named pipe", ord("S"): "a GNU sparse file",
          ord("V"): "a volume label", ord("M"): "a multi-volume part"}


class _Windows:
    """1 MiB windows of an open shard, with each 512-byte block's byte sum and the sum of its
    checksum field's 8 bytes (what the header checksum needs: one numpy pass a window instead
    of one Python ``sum`` a header)."""

    def __init__(self, f: Any, size: int):
        self.f, self.size = f, size
        self.start, self.buf, self.sums, self.chks = 0, b"", [], []
        self.valid: list = []
        self.sizes: list = []
        self.flags: list = []

    def load(self, pos: int) -> bool:
        """Read the window starting at ``pos``; False when no whole block is left there.

        Per block, vectorized: its byte sum, the sum of its checksum field, whether it is a header
        in the usual form whose checksum is right (six octal digits and a NUL), its size field
        in the usual form (eleven octal digits; -1 otherwise) and its type flag. The scan walks
        the headers through these lists and parses only an unusual field itself."""
        if pos + _BLOCK > self.size:
            return False
        self.f.seek(pos)
        n = max(_BLOCK, min(_WINDOW, self.size - pos)) // _BLOCK * _BLOCK
        self.buf, self.start = self.f.read(n), pos
        whole = len(self.buf) // _BLOCK * _BLOCK
        blocks = np.frombuffer(self.buf, np.uint8, whole).reshape(-1, _BLOCK)
        sums = blocks.sum(axis=1, dtype=np.int64)
        chks = blocks[:, 148:156].sum(axis=1, dtype=np.int64)
        digits = blocks[:, 148:154].astype(np.int64) - 48
        usual = ((digits >= 0) & (digits <= 7)).all(axis=1) & (blocks[:, 154] == 0)
        self.valid = (usual & (digits @ _POW6 == sums - chks + 256)).tolist()
        digits = blocks[:, 124:135].astype(np.int64) - 48
        usual = ((digits >= 0) & (digits <= 7)).all(axis=1) & ((blocks[:, 135] == 0) | (blocks[:, 135] == 32))
        self.sizes = np.where(usual, digits @ _POW11, -1).tolist()
        self.sums, self.chks, self.flags = sums.tolist(), chks.tolist(), blocks[:, 156].tolist()
        return whole >= _BLOCK

    def data(self, pos: int, n: int) -> bytes:
        """``n`` bytes at ``pos`` (a long name, a pax header, a ``.cls``)."""
        at = pos - self.start
        if self.start <= pos and at + n <= len(self.buf):
            return self.buf[at:at + n]
        self.f.seek(pos)
        return self.f.read(n)


def _damage(pos: int, what: str) -> tuple:
    """The entry that ends a damaged shard's listing."""
    return ("", pos, 0, "file", f"{what} at offset {pos}: the members after it cannot be listed", None)


def scan_shard(f: Any, size: int, keep: str = "") -> Iterator[Member]:
    """The members of the tar in the open binary file ``f`` of ``size`` bytes, in order, from
    their headers (see the module doc); damage ends the scan with one ``Member`` whose
    ``problem`` says where and what. ``keep``: a lower-case name ending (``".cls"``) whose
    members' bytes are read too (``Member.data``, from the window already there)."""
    for m in _scan(f, size, keep):
        yield Member(*m)


def _scan(f: Any, size: int, keep: str) -> Iterator[tuple]:
    """``scan_shard``'s members as plain tuples (the listing's loop: no object a member)."""
    win = _Windows(f, size)
    pos, long_name, pax = 0, None, None
    keep_n = len(keep)
    start, buf, last = 0, b"", -1  # the window and its per-block lists, bound to locals (the hot loop)
    sums = chks = valid = sizes = flags = []
    while True:
        at = pos - start
        if not (0 <= at <= last):
            if not win.load(pos):
                if pos < size:
                    yield _damage(pos, "the shard ends inside a header")
                return  # (no end-of-archive marker: the members listed are all there is, as tar reads it)
            start, buf, at = win.start, win.buf, 0
            sums, chks, valid, sizes, flags = win.sums, win.chks, win.valid, win.sizes, win.flags
            last = len(buf) - _BLOCK
        k = at >> 9
        if not valid[k]:  # an empty block, or a checksum field not in the usual form: look closer
            if sums[k] == 0:  # the end-of-archive marker
                yield from _after_end(f, pos, size)
                return
            try:
                stored = _octal(buf[at + 148:at + 156])
            except ValueError:
                stored = -1
            if stored != sums[k] - chks[k] + 256:  # the checksum field counts as 8 spaces
                yield _damage(pos, "damaged tar header (checksum mismatch)")
                return
        length = sizes[k]
        if length < 0:
            try:
                length = _octal(buf[at + 124:at + 136])
            except ValueError:
                yield _damage(pos, "damaged tar header (size field)")
                return
        flag = flags[k]
        data = pos + _BLOCK
        if flag in _EXTENDED:  # a header about the next member
            if data + length > size:
                yield _damage(pos, "the shard ends inside an extended header")
                return
            raw = win.data(data, length)
            if flag == 76:  # L: a GNU long name
                long_name = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif flag == 120:  # x: pax records
                try:
                    pax = _pax(raw)
                except ValueError:
                    yield _damage(pos, "damaged pax header")
                    return
            pos = data + (length + _BLOCK - 1) // _BLOCK * _BLOCK
            continue
        if pax and "path" in pax:
            name = pax["path"]
        elif long_name is not None:
            name = long_name
        else:
            name = buf[at:at + 100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if buf[at + 345] != 0 and buf[at + 257:at + 263] == b"ustar\0":  # POSIX: the prefix holds the folders
                name = buf[at + 345:at + 500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape") + "/" + name
        if pax:
            if "size" in pax:
                try:
                    length = int(pax["size"])
                except ValueError:
                    yield _damage(pos, "damaged pax size")
                    return
            pax = None
        long_name = None
        if flag in _REGULAR and not (flag == 0 and name.endswith("/")):
            if data + length > size:
                yield (name, data, length, "file", f"truncated: the shard ends {size - data} bytes into its {length}",
                       None)
                return
            yield (name, data, length, "file", "",
                   win.data(data, length) if keep_n and name[-keep_n:].lower() == keep else None)
            pos = data + (length + _BLOCK - 1) // _BLOCK * _BLOCK
            continue
        if flag == 0 or flag == 53:  # a folder ("5"; an old V7 one: a name ending in /), as tarfile reads it
            yield (name.rstrip("/"), data, 0, "dir", "", None)
            pos = data
            continue
        kind = _KINDS.get(flag, f"a tar member of type {bytes([flag])!r}")
        if flag not in _NO_DATA:  # as tarfile skips: the data of types it does not know
            if data + length > size:
                yield (name, data, length, kind, f"truncated: the shard ends {size - data} bytes into its {length}",
                       None)
                return
            pos = data + (length + _BLOCK - 1) // _BLOCK * _BLOCK
        else:
            pos = data
        yield (name, data, 0, kind, "", None)


def _after_end(f: Any, pos: int, size: int) -> Iterator[tuple]:
    """After the end-of-archive marker only zeros may follow (the record padding); anything
    else (a damaged block read as the end, a second archive appended) is reported."""
    f.seek(pos)
    at = pos
    while at < size:
        chunk = f.read(min(_WINDOW, size - at))
        if not chunk:
            return
        if chunk.count(0) != len(chunk):
            first = at + next(i for i, b in enumerate(chunk) if b)
            yield ("", first, 0, "file", f"data at offset {first} after the end-of-archive marker at {pos}: an "
                   "empty block inside the archive, or another archive appended; the members after it cannot be "
                   "listed", None)
            return
        at += len(chunk)


# -- which shards -------------------------------------------------------------------------------------
def expand_shards(spec: str | os.PathLike) -> list[str]:
    """The shards ``spec`` names, in order: a brace pattern (``shard-{000000..000099}.tar``,
    expanded as webdataset expands it, by ``braceexpand``), a glob, a folder (its ``.tar`` files,
    sorted), one file or a URL (braces expanded too)."""
    text = os.fspath(spec)
    if "{" in text:
        try:
            from braceexpand import braceexpand
        except ImportError as e:
            raise UsageError(f"{text}: brace patterns need braceexpand: pip install 'packer[wds]'") from e
        return list(braceexpand(text))
    from packer.remote.url import is_url

    if is_url(text):
        return [text]
    if any(c in text for c in "*?["):
        import glob

        return sorted(glob.glob(text))
    path = Path(text)
    if path.is_dir():
        return [str(p) for p in sorted(path.iterdir()) if p.suffix == ".tar" and not p.name.startswith(".")]
    return [text]


def _local(shard: str, failures: list[InputFailure] | None) -> str | None:
    """The local file to read ``shard`` from (a URL fetched into the cache), or None when it is
    missing or cannot be fetched (recorded)."""
    from packer.remote.url import is_url, redact

    if not is_url(shard):
        if not os.path.isfile(shard):
            bad_line(failures, shard, 0, "no such shard (or not a file): its samples are not packed")
            return None
        return shard
    try:
        return str(fetch_source(shard))
    except Exception as e:  # noqa: BLE001 - RemoteError, OSError: recorded as this shard's failure
        bad_line(failures, redact(shard), 0, f"cannot fetch this shard ({e}): its samples are not packed")
        return None


def fetch_source(url: str, *, storage_options: dict | None = None) -> Path:
    """A local copy of the file at ``url`` in the node cache (``$PACKER_CACHE_DIR/sources/``),
    downloaded with ``packer.remote.fetch``'s retries unless a copy of the same size and
    ETag/mtime is there already."""
    from packer.remote.cache import default_cache_dir
    from packer.remote.fetch import fetch_file
    from packer.remote.url import cache_key, secrets_of, url_filesystem

    fs, rpath = url_filesystem(url, storage_options)
    info = fs.info(rpath)
    stamp = {"size": info.get("size"), "etag": str(info.get("ETag") or info.get("etag") or ""),
             "mtime": str(info.get("LastModified") or info.get("mtime") or "")}
    dest = default_cache_dir() / "sources" / cache_key(url) / (url.rstrip("/").rsplit("/", 1)[-1].split("?")[0] or "shard")
    marker = dest.with_name(f".{dest.name}.source.json")
    try:
        if dest.is_file() and json.loads(marker.read_text()) == stamp and dest.stat().st_size == stamp["size"]:
            return dest
    except (OSError, ValueError):
        pass
    fetch_file(fs, rpath, dest, url=url, size=stamp["size"] if isinstance(stamp["size"], int) else None,
               secrets=secrets_of(url, storage_options))
    marker.write_text(json.dumps(stamp))
    return dest


_IDENTITIES: dict[tuple[str, int], tuple[int, int]] = {}


def url_identity(local: str) -> tuple[int, int]:
    """What stands for a URL shard's version in the resume's ``(size, mtime_ns)``: the object's
    size and a number made from its ETag and modification time, as ``fetch_source`` recorded them
    beside the cached copy (the same on every node; ``(-1, -1)`` when no record is there). A
    shard replaced at its URL between two runs then refuses the resume, as a changed local
    file does."""
    marker = Path(local).with_name(f".{Path(local).name}.source.json")
    try:
        at = marker.stat().st_mtime_ns
    except OSError:
        return -1, -1
    got = _IDENTITIES.get((local, at))
    if got is None:
        import hashlib

        try:
            stamp = json.loads(marker.read_text())
        except (OSError, ValueError):
            return -1, -1
        digest = hashlib.sha256(f"{stamp.get('etag', '')}|{stamp.get('mtime', '')}".encode()).digest()
        size = stamp.get("size")
        got = (size if isinstance(size, int) else -1, int.from_bytes(digest[:7], "little"))
        _IDENTITIES[(local, at)] = got
    return got


# -- reading members where the work runs --------------------------------------------------------------
class _Files:
    """Open shards of this process (at most ``keep``, least recently used closed first), read with
    ``os.pread``; a lock makes them safe for the staged plan's completion threads. A forked
    worker inherits them: ``pread`` moves no shared file position."""

    def __init__(self, keep: int = 32):
        self.keep, self.fds, self.lock = keep, OrderedDict(), threading.Lock()
        self.last: tuple[str | None, int] = (None, -1)  # the shard read last (most reads: the same)

    def pread(self, path: str, size: int, offset: int) -> tuple[bytes, os.stat_result]:
        with self.lock:
            if self.last[0] == path:
                fd = self.last[1]
            else:
                fd = self.fds.get(path)
                if fd is None:
                    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                    self.fds[path] = fd
                    while len(self.fds) > self.keep:
                        os.close(self.fds.popitem(last=False)[1])
                else:
                    self.fds.move_to_end(path)
                self.last = (path, fd)
            return os.pread(fd, size, offset), os.fstat(fd)

    def close(self) -> None:
        with self.lock:
            self.last = (None, -1)
            while self.fds:
                os.close(self.fds.popitem()[1])


_FILES = _Files()


def close_shards() -> None:
    """Close the shards this process holds open (the command calls it when its run ends)."""
    _FILES.close()


@dataclass(frozen=True, init=False)
class TarSample(SourceItem):
    """One sample of a tar shard: ``path`` is the shard as given (a URL redacted), ``local``
    the file read, ``members`` its ``(field, offset, size)`` triples in schema order, ``types``
    the fields' types (one tuple shared by every sample of a listing)."""

    def __init__(self, key: str, path: str, label: int, *, local: str, members: tuple, types: tuple):
        # (every field set at once, not through the parents' __init__ chain: millions of items)
        self.__dict__.update(key=key, path=path, label=label, values=None, local=local, members=members, types=types)

    def _bytes(self, name: str, offset: int, size: int) -> tuple[bytes, tuple[int, int] | None]:
        try:
            data, st = _FILES.pread(self.local, size, offset)
        except OSError as e:
            raise CorruptSample(self.key, self.path, f"cannot read member .{name} ({e.strerror or e})",
                                stage="read") from e
        if len(data) != size:
            raise CorruptSample(self.key, self.path, f"member .{name} is cut short: {len(data)} of {size} bytes "
                                                     "(the shard changed since it was listed)", stage="read")
        return data, ((st.st_size, st.st_mtime_ns) if self.local == self.path else url_identity(self.local))

    def identity(self) -> tuple[int, int]:
        """The shard's ``(size, mtime_ns)``; a URL shard's ``url_identity``."""
        return super().identity() if self.local == self.path else url_identity(self.local)

    def read(self) -> tuple[bytes, tuple[int, int] | None]:
        for (name, offset, size), kind in zip(self.members, self.types):
            if kind == "image":
                return self._bytes(name, offset, size)
        raise CorruptSample(self.key, self.path, "the sample has no image", stage="read")

    def read_values(self) -> tuple[dict[str, Any], tuple[int, int] | None]:
        values: dict[str, Any] = {}
        stat = None
        for (name, offset, size), kind in zip(self.members, self.types):
            if name == "label":
                values[name] = self.label
                continue
            data, stat = self._bytes(name, offset, size)
            values[name] = _value(self, name, kind, data)
        return values, stat


def _value(item: TarSample, name: str, kind: str, data: bytes) -> Any:
    """A member's bytes as its field takes them; ``CorruptSample`` (stage ``decode``) when they
    are not what the extension says."""
    try:
        if kind == "str":
            return data.decode("utf-8")
        if kind == "json":
            return json.loads(data.decode("utf-8"))
        if kind.startswith("ndarray"):
            return np.load(io.BytesIO(data), allow_pickle=False)
    except (UnicodeDecodeError, ValueError, OSError, EOFError) as e:
        raise CorruptSample(item.key, item.path, f"member .{name} is not {kind.split(':')[0]} ({e})",
                            stage="decode") from e
    return data


# -- listing -----------------------------------------------------------------------------------------
class _Sample:
    """A sample while it is listed: its key and shard, its members (extension -> (offset,
    size, member name)), what is wrong with it, its ``.cls`` bytes and the name of its image
    member (even one that cannot be read: failures name it)."""

    __slots__ = ("key", "shard", "members", "problems", "cls", "image")

    def __init__(self, key: str, shard: str):
        self.key, self.shard, self.members, self.problems, self.cls, self.image = key, shard, {}, [], b"", ""



def _samples(shard: str, local: str, exts: Sequence[str], failures: list[InputFailure] | None) -> Iterator[_Sample]:
    """The samples of one shard (consecutive members sharing a key), with what is wrong with each."""
    try:
        f = open(local, "rb")
    except OSError as e:
        bad_line(failures, shard, 0, f"cannot open this shard ({e.strerror or e}): its samples are not packed")
        return
    with f:
        size = os.fstat(f.fileno()).st_size
        current: _Sample | None = None
        for name, offset, length, kind, problem, data in _scan(f, size, ".cls"):
            if kind == "dir":
                continue
            if problem and not name:  # damage between members: the rest is unlisted
                if current is not None:
                    yield current
                    current = None
                bad_line(failures, shard, 0, problem)
                continue
            key, ext = split_name(name)
            if key is None:
                bad_line(failures, shard, 0, f"member {name!r} has no extension: not part of a sample", name)
                continue
            ext = ext.lower()
            if current is None or key != current.key:
                if current is not None:
                    yield current
                current = _Sample(key, shard)
            if ext in exts and not current.image:
                current.image = name
            if problem:
                current.problems.append(f"member {name!r} is {problem}")
            elif kind != "file":
                current.problems.append(f"member {name!r} is {kind}, not a file")
            elif ext in current.members:
                current.problems.append(f"two members named {name!r} (the same key and extension)")
            else:
                current.members[ext] = (offset, length, name)
                if data is not None:
                    current.cls = data
        if current is not None:
            yield current


def _field_of(ext: str, exts: Sequence[str]) -> tuple[str, str]:
    """``(field name, type)`` of a member extension (see the module doc)."""
    if ext in exts:
        return "image", "image"
    if ext == "cls":
        return "label", "int"
    last = ext.rsplit(".", 1)[-1]
    if last in exts:
        return ext, "image"
    return ext, FIELD_TYPES.get(last, "bytes")


def _npy_type(local: str, offset: int, size: int) -> str:
    """``ndarray:DTYPE:*,...`` from a ``.npy`` member's header (leading dimension free)."""
    with open(local, "rb") as f:
        f.seek(offset)
        head = io.BytesIO(f.read(min(size, 4096)))
    try:
        version = np.lib.format.read_magic(head)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read_header(head)
    except ValueError as e:
        raise UsageError(f"{local}: a .npy member at offset {offset} is not a numpy array ({e})") from e
    trailing = ",".join(str(d) for d in shape[1:])
    return f"ndarray:{np.dtype(dtype).name}:*" + (f",{trailing}" if trailing else "")


def shard_items(spec: str | os.PathLike, *, exts: Sequence[str], class_index: str | os.PathLike | None = None,
                failures: list[InputFailure] | None = None) -> SourceListing:
    """The samples of the tar shards ``spec`` names (``expand_shards``) as items.

    Every sample must carry the members some sample has (their extensions taken together). When
    those are exactly an image and a ``.cls``, the shards are a plain image pack labelled by the
    ``.cls`` values, in shard order; classes ``0..max`` or ``class_index``'s names. An image alone
    whose keys hold a folder (``cat/0001.jpg``: the tar of a class-folder tree) is a plain image
    pack labelled as an ImageFolder labels them, in its order (classes sorted, keys sorted), so
    the pack equals packing the same files from the folder. Anything else is a field pack
    (``schema`` set), in shard order. Unusable samples go to ``failures`` (see the module doc).

    One pass over the shards, checking each sample against the first sample's extensions as it
    goes; only when a later sample brings another extension are the shards listed again against
    them all (their failures from the first pass dropped).
    """
    from packer.remote.url import redact

    shards = expand_shards(spec)
    if not shards:
        raise UsageError(f"{spec}: names no .tar shards")
    opened = []
    for shard in shards:
        local = _local(shard, failures)
        if local is not None:
            opened.append((redact(shard), local))
    known: set[str] | None = None
    while True:
        run = _Pass(exts, known)
        for name, local in opened:
            for sample in _samples(name, local, exts, run.failures):
                run.add(sample, local)
        if run.complete:
            break
        known = run.seen
    if failures is not None:
        failures.extend(run.failures)
    elif run.failures:
        raise UsageError(str(run.failures[0]))
    return run.listing(dict(opened), class_index, failures, str(spec))


class _Pass:
    """One pass of ``shard_items`` over the samples: the fields (from ``known`` extensions, or
    the first sample's), each sample checked against them into a row or a failure; ``complete``
    turns False when a sample brings an extension the fields lack (then a second pass is due)."""

    def __init__(self, exts: Sequence[str], known: set[str] | None):
        self.exts, self.complete, self.failures = exts, True, []
        self.seen: set[str] = set(known or ())
        self.field_of: dict[str, str] = {}  # extension -> field name, once per extension
        self.fields: dict[str, str] | None = None  # field -> type
        self.order: list[str] = []
        self.rows: list[tuple[str, str, int, tuple]] = []  # (shard, key, label, (field, offset, size)...)
        if known is not None:
            self._fields(known)

    def _name(self, ext: str) -> str:
        n = self.field_of.get(ext)
        if n is None:
            n = self.field_of[ext] = _field_of(ext, self.exts)[0]
        return n

    def _fields(self, extensions: Any) -> None:
        """The fields of ``extensions`` (one image field, whichever image extension)."""
        self.fields = {}
        for ext in sorted(extensions):
            field, kind = _field_of(ext, self.exts)
            if kind == "ndarray":  # its dtype and shape: from the first sample that has it
                kind = "ndarray:pending"
            self.fields.setdefault(field, kind)
        order = ["image", "label"] + sorted(n for n in self.fields if n not in ("image", "label"))
        self.order = [n for n in order if n in self.fields]

    def add(self, s: _Sample, local: str) -> None:
        """Check one sample against the fields: a row, or a failure naming its shard and key."""
        if self.fields is None:
            self.seen.update(s.members)
            self._fields(s.members)
        elif not self.seen.issuperset(s.members):
            self.seen.update(s.members)
            if any(self._name(e) not in self.fields for e in s.members):
                self.complete = False  # (listed again against every extension: no more rows now)
        if not self.complete:
            return
        fields, order = self.fields, self.order
        by_field: dict[str, tuple] = {}
        images = []
        for ext, m in s.members.items():
            n = self._name(ext)
            if n == "image":
                images.append(ext)
            elif fields[n] == "ndarray:pending":
                fields[n] = _npy_type(local, m[0], m[1])
            by_field[n] = m
        problems = s.problems
        if len(images) > 1:
            problems.append(f"two images ({', '.join('.' + e for e in images)})")
        if len(by_field) != len(order) and not problems:
            if "image" in fields and not images:
                problems.append("the sample has no image member" + (
                    f" (it has {', '.join('.' + e for e in s.members)})" if s.members else ""))
            else:
                problems.append(f"the sample lacks {', '.join(n for n in order if n not in by_field)} "
                                "(other samples have it)")
        key = by_field["image"][2] if images else s.image or s.key
        if not _plain_key(key):
            try:
                key = safe_key(key, s.shard)
            except UsageError as e:
                problems.append(str(e).removeprefix(f"{s.shard}: "))
        label = -1
        if not problems and "label" in by_field:
            try:
                label = int(s.cls.decode("ascii").strip())
                if label < 0:
                    raise ValueError
            except (ValueError, UnicodeDecodeError):
                problems.append(f"member {by_field['label'][2]!r} is not a class index (a non-negative integer)")
        if problems:
            bad_line(self.failures, s.shard, 0, "; ".join(problems), key)
            return
        self.rows.append((s.shard, key, label, tuple((n, *by_field[n][:2]) for n in order)))

    def listing(self, local_of: dict[str, str], class_index: Any, failures: list[InputFailure] | None,
                spec: str) -> SourceListing:
        """The items, classes and schema of the rows (see ``shard_items``)."""
        fields, rows, exts = self.fields or {}, self.rows, self.exts
        fields = {n: ("bytes" if t == "ndarray:pending" else t) for n, t in fields.items()}
        names = set(fields)
        layout = "cls" if names == {"image", "label"} else "folders" if names == {"image"} and any(
            "/" in row[1] for row in rows) else "fields"
        types = tuple(fields[n] for n in self.order)
        try:
            schema = None if layout != "fields" else Schema({n: fields[n] for n in self.order})
        except ValueError as e:
            raise UsageError(f"{spec}: these members cannot be fields ({e})") from e
        index = None
        if class_index is not None:
            index = lists.read_class_index(class_index, tree=lambda train: _tree_classes(train, exts))
        recorded = {"source": "wds", "layout": layout}
        if layout == "folders":
            return _folder_listing(rows, local_of, types, index, class_index, failures, recorded, spec)
        if "label" in fields:
            if index is not None:
                classes = lists.Classes.of_index(index)
                keep = []
                for row in rows:
                    if row[2] >= len(classes):
                        bad_line(failures, row[0], 0, f"label {row[2]} is outside the class index "
                                                      f"(0..{len(classes) - 1})", row[1])
                    else:
                        keep.append(row)
                rows = keep
                recorded["label_map"] = classes.label_map
            else:
                n = max((r[2] for r in rows), default=-1) + 1
                classes = lists.Classes([str(i) for i in range(n)], label_map="cls",
                                        note=f"{n} classes from the .cls labels, named by their numbers")
        else:
            if index is not None:
                raise UsageError("--class-index names labels: these shards have no .cls members nor class folders")
            classes = lists.Classes([])
        items = [TarSample(key, shard, label, local=local_of[shard], members=triples, types=types)
                 for shard, key, label, triples in rows]
        return SourceListing(items, classes, schema, failures if failures is not None else [], recorded,
                             getattr(classes, "note", ""))


def _plain_key(key: str) -> bool:
    """Whether ``safe_key`` would take ``key`` as it is, by cheap tests (printable ASCII, no
    empty, ``.`` or ``..`` part, not absolute); anything else goes through ``safe_key``."""
    return (key.isascii() and key.isprintable() and key[:1] not in ("/", ".", "") and "/." not in key
            and "//" not in key and not key.endswith("/"))


def _tree_classes(train: Path, exts: Sequence[str]) -> list[str]:
    from packer.conversion.inputs import top_level

    return top_level(train, exts)[0]


def _folder_listing(rows: list, local_of: dict[str, str], types: tuple, index: Any, class_index: Any,
                    failures: list[InputFailure] | None, recorded: dict[str, Any], spec: str) -> SourceListing:
    """A tar of a class-folder tree: labelled and ordered as ``image_folder`` labels and orders
    the same files (an image outside any class folder is recorded, as one beside them is)."""
    keep = []
    for row in rows:
        if "/" not in row[1]:
            bad_line(failures, row[0], 0, f"{row[1]}: an image outside the class folders belongs to no class", row[1])
        else:
            keep.append(row)
    names = sorted({row[1].split("/", 1)[0] for row in keep})
    if index is not None:
        classes = lists.Classes.of_index(index)
        label_of = lists.labels_of(names, index, spec, class_index)[1]
        recorded["label_map"] = classes.label_map
    else:
        classes = lists.Classes(names)
        classes.note = (f"{len(names)} class folders numbered in sorted order (byte order): "
                        f"{classes.first_labels()}")
        label_of = {n: i for i, n in enumerate(names)}
    items = sorted((TarSample(key, shard, label_of[key.split("/", 1)[0]], local=local_of[shard],
                              members=triples, types=types) for shard, key, _, triples in keep),
                   key=lambda it: (it.label, it.key))
    return SourceListing(items, classes, None, failures if failures is not None else [], recorded,
                         getattr(classes, "note", ""))
