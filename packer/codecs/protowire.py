"""A minimal protobuf wire-format codec: enough for Caffe ``Datum`` and ``tf.train.Example``.

Hand-written so that reading a packed file never needs generated code or a protobuf runtime,
and so that malformed bytes raise ``ValueError`` (readers turn that into ``CorruptData``).
"""
from __future__ import annotations

import functools
from typing import Iterator, NamedTuple

__all__ = [
    "encode_varint",
    "decode_varint",
    "field_varint",
    "field_bytes",
    "iter_fields",
    "Datum",
    "encode_datum",
    "datum_pieces",
    "decode_datum",
]

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


_ONE_BYTE = [bytes((v,)) for v in range(128)]


def encode_varint(value: int) -> bytes:
    """Encode a non-negative int (or a negative int32/int64 as its 64-bit two's complement)."""
    if 0 <= value < 128:
        return _ONE_BYTE[value]
    if 0 < value < 1 << 21:  # lengths of fields up to 2 MB (an encoded image): 2 or 3 bytes, no loop
        if value < 1 << 14:
            return bytes((value & 0x7F | 0x80, value >> 7))
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    if value < 0:
        value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def decode_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; return (value, new position). Raises ValueError if malformed."""
    result = 0
    shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def field_varint(number: int, value: int) -> bytes:
    """One varint field (tag + value)."""
    return encode_varint(number << 3 | VARINT) + encode_varint(value)


def field_bytes(number: int, value: bytes) -> bytes:
    """One length-delimited field (tag + length + bytes)."""
    return encode_varint(number << 3 | LENGTH) + encode_varint(len(value)) + value


def iter_fields(buf: bytes | memoryview) -> Iterator[tuple[int, int, object]]:
    """Yield (field number, wire type, value) for each field; value is int or a memoryview."""
    mv = memoryview(buf)
    pos = 0
    n = len(mv)
    while pos < n:
        tag, pos = decode_varint(mv, pos)
        number, wtype = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        if wtype == VARINT:
            value, pos = decode_varint(mv, pos)
        elif wtype == LENGTH:
            length, pos = decode_varint(mv, pos)
            if pos + length > n:
                raise ValueError("length-delimited field runs past the end")
            value = mv[pos:pos + length]
            pos += length
        elif wtype == FIXED64:
            if pos + 8 > n:
                raise ValueError("truncated fixed64")
            value = int.from_bytes(mv[pos:pos + 8], "little")
            pos += 8
        elif wtype == FIXED32:
            if pos + 4 > n:
                raise ValueError("truncated fixed32")
            value = int.from_bytes(mv[pos:pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wtype}")
        yield number, wtype, value


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


class Datum(NamedTuple):
    """Caffe ``Datum``: channels=1, height=2, width=3, data=4, label=5, encoded=7."""

    data: bytes
    label: int
    height: int
    width: int
    channels: int
    encoded: bool


def encode_datum(data: bytes, label: int, height: int, width: int, channels: int,
                 encoded: bool = True) -> bytes:
    """Serialize a Caffe ``Datum`` in field-number order, as protobuf's own serializer does."""
    return b"".join(datum_pieces(data, label, height, width, channels, encoded))


def datum_pieces(data: bytes, label: int, height: int, width: int, channels: int,
                 encoded: bool = True) -> tuple[bytes, bytes, bytes]:
    """``encode_datum``'s bytes in three pieces, (the fields before ``data``, ``data``, the fields
    after it), to be written one after the other where a joined copy would cost a copy of
    ``data`` (``packer.conversion.plans.shm``)."""
    # field 4 spelled out; the fields around it come from small caches (a dataset has few
    # distinct shapes and labels)
    return (_datum_head(channels, height, width) + _FIELD4_TAG + encode_varint(len(data)), data,
            _datum_tail(label, encoded))


def _datum_head(channels: int, height: int, width: int) -> bytes:
    head = _HEADS.get((channels, height, width))
    if head is None:
        head = _field_cached(1, channels) + _field_cached(2, height) + _field_cached(3, width)
        if len(_HEADS) < 65536:  # a dataset's distinct shapes; beyond that, built each time
            _HEADS[(channels, height, width)] = head
    return head


_HEADS: dict[tuple[int, int, int], bytes] = {}


@functools.lru_cache(maxsize=8192)
def _field_cached(number: int, value: int) -> bytes:
    """``field_varint`` of the few distinct heights, widths and channels of a dataset (a cache
    per field: photos of varied sizes would miss one keyed by the whole shape)."""
    return field_varint(number, value)


@functools.lru_cache(maxsize=4096)
def _datum_tail(label: int, encoded: bool) -> bytes:
    return field_varint(5, label) + field_varint(7, 1 if encoded else 0)


_FIELD4_TAG = encode_varint(4 << 3 | LENGTH)

def decode_datum(buf: bytes | memoryview) -> Datum:
    """Parse a Caffe ``Datum``; unknown fields are skipped, malformed bytes raise ValueError.

    ``iter_fields``'s rules in one loop (no generator, one-byte varints inline): every stored
    image is parsed on read, and this is a quarter of an LMDB fetch's CPU otherwise."""
    channels = height = width = label = 0
    encoded = False
    start = end = 0
    n = len(buf)
    pos = 0
    while pos < n:
        tag = buf[pos]
        pos += 1
        if tag & 0x80:
            tag, pos = decode_varint(buf, pos - 1)
        number, wtype = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        if wtype == VARINT or wtype == LENGTH:
            if pos >= n:
                raise ValueError("truncated varint")
            value = buf[pos]
            pos += 1
            if value & 0x80:
                value, pos = decode_varint(buf, pos - 1)
            if wtype == LENGTH:
                if pos + value > n:
                    raise ValueError("length-delimited field runs past the end")
                if number == 4:
                    start, end = pos, pos + value
                pos += value
            elif number == 1:
                channels = _int32(value)
            elif number == 2:
                height = _int32(value)
            elif number == 3:
                width = _int32(value)
            elif number == 5:
                label = _int32(value)
            elif number == 7:
                encoded = bool(value)
        elif wtype == FIXED64 or wtype == FIXED32:
            pos += 8 if wtype == FIXED64 else 4
            if pos > n:
                raise ValueError(f"truncated fixed{64 if wtype == FIXED64 else 32}")
        else:
            raise ValueError(f"unsupported wire type {wtype}")
    return Datum(bytes(buf[start:end]), label, height, width, channels, encoded)
