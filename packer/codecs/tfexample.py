"""``tf.train.Example`` codec on top of ``packer.codecs.protowire`` (no TensorFlow, no generated code).

``Example { Features features = 1 }``, ``Features { map<string, Feature> feature = 1 }``,
``Feature { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3 } }``,
each list a ``repeated value = 1`` (int64 and float packed). ``encode_example`` writes the map
sorted by key (C++ protobuf's deterministic order; Python's upb orders a key after the longer
keys it prefixes, which never happens among the ImageNet feature names), so the bytes of a
given sample never depend on dict order. ``decode_example`` accepts packed and unpacked
numeric lists (as every protobuf parser must) and raises ``ValueError`` on malformed bytes.
"""
from __future__ import annotations

import struct
from typing import Any, Mapping, Sequence, Union

from packer.codecs.protowire import FIXED32, FIXED64, LENGTH, VARINT, decode_varint, encode_varint, field_bytes

__all__ = ["Int64List", "FloatList", "FeatureValue", "encode_example", "example_pieces", "feature_entry", "bytes_entry_head", "example_head",
           "decode_example", "int64_feature"]

FeatureValue = Union[bytes, int, float, Sequence[bytes], Sequence[int], Sequence[float]]

_BYTES, _FLOAT, _INT64 = 1, 2, 3


class Int64List(list):
    """An ``int64_list`` feature value, also when empty (a plain empty list has no kind)."""


class FloatList(list):
    """A ``float_list`` feature value (float32), also when empty."""


def _kind(value: FeatureValue) -> tuple[int, list]:
    """(Feature field number, list of values) of a Python value."""
    if isinstance(value, Int64List):
        return _INT64, [int(v) for v in value]
    if isinstance(value, FloatList):
        return _FLOAT, [float(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _BYTES, [value]
    if isinstance(value, int):
        return _INT64, [int(value)]
    if isinstance(value, float):
        return _FLOAT, [value]
    values = list(value)
    if not values:
        raise ValueError("an empty list has no feature type; give a typed value")
    if all(isinstance(v, (bytes, bytearray, memoryview)) for v in values):
        return _BYTES, values
    if all(isinstance(v, int) for v in values):
        return _INT64, [int(v) for v in values]
    if all(isinstance(v, (int, float)) for v in values):
        return _FLOAT, [float(v) for v in values]
    raise ValueError(f"mixed or unsupported feature values: {values[:3]!r}")


def _encode_feature(value: FeatureValue) -> bytes:
    kind, values = _kind(value)
    if not values:  # an empty list of its kind (as protobuf serializers write it)
        return field_bytes(kind, b"")
    if kind == _BYTES:
        body = b"".join(field_bytes(1, bytes(v)) for v in values)
    elif kind == _INT64:
        for v in values:
            if not -(1 << 63) <= v < (1 << 63):
                raise ValueError(f"int64 feature value out of range: {v}")
        body = field_bytes(1, b"".join(encode_varint(v) for v in values))
    else:
        body = field_bytes(1, struct.pack(f"<{len(values)}f", *values))
    return field_bytes(kind, body)


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialize ``{name: bytes | int | float | list of one of them}`` as a ``tf.train.Example``.

    ints become ``int64_list``, floats ``float_list``, bytes ``bytes_list``.
    """
    return b"".join(example_pieces(features)[0])


def _wrap(number: int, pieces: list, length: int) -> tuple[list, int]:
    """A length-delimited field around ``pieces`` (``length`` bytes), without joining them."""
    head = encode_varint(number << 3 | LENGTH) + encode_varint(length)
    return [head, *pieces], len(head) + length


def example_pieces(features: Mapping[str, FeatureValue]) -> tuple[list, int]:
    """``encode_example``'s bytes as a list of pieces and their total length: the large values
    (``image/encoded``) are never copied, so a caller can frame, checksum and write them, or
    join them once. ``b"".join(pieces) == encode_example(features)``."""
    entries: list = []
    total = 0
    for name in sorted(features):
        value = features[name]
        if type(value) is bytes:  # one bytes value: the image stays where it is, no copy
            pieces, n = _bytes_entry(name, value)
            if n <= 256:
                entries.append(b"".join(pieces))
            else:
                entries += pieces
            total += n
        else:
            entry = _small_entry(name, value)
            entries.append(entry)
            total += len(entry)
    return _wrap(1, entries, total)


def _bytes_entry(name: str, value: bytes) -> tuple[list, int]:
    """The map entry of a one-value ``bytes_list`` feature as pieces (``value`` not copied)."""
    head = bytes_entry_head(name, len(value))
    return [head, value], len(head) + len(value)


def feature_entry(name: str, value: bytes | int) -> bytes:
    """The whole map entry of a one-value ``bytes`` or ``int`` feature, exactly as
    ``example_pieces`` writes it (ints memoized)."""
    if type(value) is bytes:
        return bytes_entry_head(name, len(value)) + value
    return _small_entry(name, value)


def bytes_entry_head(name: str, size: int) -> bytes:
    """The bytes of a one-value ``bytes`` feature's map entry before its ``size`` bytes of value:
    entry = {1: key, 2: Feature {1: BytesList {1: value}}}, every tag a length-delimited 1 or 2;
    ``bytes_entry_head(n, len(v)) + v == feature_entry(n, v)``."""
    body = encode_varint(size)  # BytesList {1: value}
    feature_len = 1 + len(body) + size
    feature = encode_varint(feature_len)  # Feature {1: BytesList}
    value_len = 1 + len(feature) + feature_len
    value = encode_varint(value_len)
    key = _key(name)
    entry = encode_varint(len(key) + 1 + len(value) + value_len)
    return b"".join((b"\x0a", entry, key, b"\x12", value, b"\x0a", feature, b"\x0a", body))


def example_head(length: int) -> bytes:
    """What comes before ``length`` bytes of map entries in an ``Example``: with the entries in
    name order, ``example_head(len(e)) + e`` is ``encode_example``'s bytes."""
    return b"\x0a" + encode_varint(length)


_KEYS: dict[str, bytes] = {}
_ENTRIES: dict[tuple, bytes] = {}  # (name, int value) -> the whole map entry; labels, sizes repeat


def _key(name: str) -> bytes:
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = field_bytes(1, name.encode("utf-8"))
    return key


def _small_entry(name: str, value: FeatureValue) -> bytes:
    """One whole map entry (``key``, ``value``) of a small feature, memoized for ints."""
    cacheable = type(value) is int
    if cacheable:
        entry = _ENTRIES.get((name, value))
        if entry is not None:
            return entry
    entry = field_bytes(1, _key(name) + field_bytes(2, _encode_feature(value)))
    if cacheable:
        if len(_ENTRIES) >= 1 << 16:
            _ENTRIES.clear()
        _ENTRIES[(name, value)] = entry
    return entry


def _int64(value: int) -> int:
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value & (1 << 63) else value


def _fields(mv: memoryview) -> list[tuple[int, int, Any]]:
    """(number, wire type, value) of each field: ``iter_fields`` as a list, with a one-byte
    fast path for tags and lengths (an Example is ~30 small fields; this is the read hot path)."""
    out = []
    pos, n = 0, len(mv)
    while pos < n:
        tag = mv[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = decode_varint(mv, pos)
        number, wtype = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        if wtype == LENGTH:
            if pos >= n:
                raise ValueError("truncated length")
            length = mv[pos]
            if length < 0x80:
                pos += 1
            else:
                length, pos = decode_varint(mv, pos)
            end = pos + length
            if end > n:
                raise ValueError("length-delimited field runs past the end")
            out.append((number, LENGTH, mv[pos:end]))
            pos = end
        elif wtype == VARINT:
            value, pos = decode_varint(mv, pos)
            out.append((number, VARINT, value))
        elif wtype == FIXED32:
            if pos + 4 > n:
                raise ValueError("truncated fixed32")
            out.append((number, FIXED32, int.from_bytes(mv[pos:pos + 4], "little")))
            pos += 4
        elif wtype == FIXED64:
            if pos + 8 > n:
                raise ValueError("truncated fixed64")
            out.append((number, FIXED64, int.from_bytes(mv[pos:pos + 8], "little")))
            pos += 8
        else:
            raise ValueError(f"unsupported wire type {wtype}")
    return out


def _packed_varints(buf: memoryview) -> list[int]:
    out, pos, n = [], 0, len(buf)
    while pos < n:
        v, pos = decode_varint(buf, pos)
        out.append(_int64(v))
    return out


def _decode_feature(buf: memoryview) -> list:
    values: list = []
    for number, wtype, value in _fields(buf):  # oneof: the last kind present wins
        if wtype != LENGTH or number not in (_BYTES, _FLOAT, _INT64):
            continue
        values = []
        for n2, w2, v in _fields(value):
            if n2 != 1:
                continue
            if number == _BYTES and w2 == LENGTH:
                values.append(bytes(v))
            elif number == _INT64 and w2 == VARINT:
                values.append(_int64(v))
            elif number == _INT64 and w2 == LENGTH:
                values.extend(_packed_varints(v))
            elif number == _FLOAT and w2 == FIXED32:
                values.append(struct.unpack("<f", v.to_bytes(4, "little"))[0])
            elif number == _FLOAT and w2 == LENGTH:
                if len(v) % 4:
                    raise ValueError("packed float list length is not a multiple of 4")
                values.extend(struct.unpack(f"<{len(v) // 4}f", v))
            else:
                raise ValueError(f"wire type {w2} is wrong for feature kind {number}")
    return values


def decode_example(buf: bytes | memoryview) -> dict[str, list]:
    """Parse a serialized ``tf.train.Example`` into ``{name: list of bytes | int | float}``.

    Unknown fields are skipped; a repeated key keeps its last value (protobuf map semantics).
    Raises ValueError on malformed bytes.
    """
    mv = memoryview(buf)
    try:
        return _decode_canonical(mv)
    except (_NotCanonical, IndexError, UnicodeDecodeError):
        return _decode_any(mv)


class _NotCanonical(Exception):
    """The bytes are not laid out as protobuf serializers write an Example: take the general path."""


def _varint_at(mv: memoryview, pos: int) -> tuple[int, int]:
    b = mv[pos]
    if b < 0x80:
        return b, pos + 1
    return decode_varint(mv, pos)


def _decode_canonical(mv: memoryview) -> dict[str, list]:
    """The fast path: one ``features`` field; entries of key then value; one kind per feature;
    numbers packed. Anything else raises _NotCanonical (never a wrong answer)."""
    out: dict[str, list] = {}
    n = len(mv)
    if n == 0:
        return out
    if mv[0] != 0x0A:
        raise _NotCanonical
    length, pos = _varint_at(mv, 1)
    if pos + length != n:
        raise _NotCanonical
    while pos < n:
        if mv[pos] != 0x0A:
            raise _NotCanonical
        length, pos = _varint_at(mv, pos + 1)
        end = pos + length
        if end > n or mv[pos] != 0x0A:
            raise _NotCanonical
        length, p = _varint_at(mv, pos + 1)
        key = str(mv[p:p + length], "utf-8")
        p += length
        if p >= end or mv[p] != 0x12:
            raise _NotCanonical
        length, p = _varint_at(mv, p + 1)
        if p + length != end:
            raise _NotCanonical
        if p == end:  # a Feature with no kind set
            out[key] = []
            pos = end
            continue
        kind = mv[p]
        length, q = _varint_at(mv, p + 1)
        if q + length != end:
            raise _NotCanonical
        values: list = []
        if kind == 0x0A:  # BytesList: repeated bytes
            while q < end:
                if mv[q] != 0x0A:
                    raise _NotCanonical
                length, q = _varint_at(mv, q + 1)
                if q + length > end:
                    raise _NotCanonical
                values.append(bytes(mv[q:q + length]))
                q += length
        elif kind in (0x1A, 0x12) and q < end:  # Int64List / FloatList, packed
            if mv[q] != 0x0A:
                raise _NotCanonical
            length, q = _varint_at(mv, q + 1)
            if q + length != end:
                raise _NotCanonical
            if kind == 0x1A:
                values = _packed_varints(mv[q:end])
            elif length % 4:
                raise _NotCanonical
            else:
                values = list(struct.unpack(f"<{length // 4}f", mv[q:end]))
        elif kind not in (0x1A, 0x12):
            raise _NotCanonical
        out[key] = values
        pos = end
    return out


def _decode_any(mv: memoryview) -> dict[str, list]:
    out: dict[str, list] = {}
    for number, wtype, features in _fields(mv):
        if number != 1 or wtype != LENGTH:
            continue
        for n1, w1, entry in _fields(features):
            if n1 != 1 or w1 != LENGTH:
                continue
            name, feature = b"", memoryview(b"")
            for n2, w2, v in _fields(entry):
                if n2 == 1 and w2 == LENGTH:
                    name = bytes(v)
                elif n2 == 2 and w2 == LENGTH:
                    feature = v
            try:
                key = name.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError("feature name is not UTF-8") from None
            out[key] = _decode_feature(feature)
    return out


def int64_feature(features: Mapping[str, list], name: str, default: int) -> int:
    """The first value of an int64 feature, or ``default`` when absent or empty."""
    values = features.get(name)
    if not values or not isinstance(values[0], int):
        return default
    return values[0]
