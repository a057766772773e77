"""tf.train.Example codec against protobuf's own (the ``tfrecord`` package's example_pb2)."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.codecs.tfexample import _decode_any, decode_example, encode_example

example_pb2 = pytest.importorskip("tfrecord.example_pb2")

names = st.text(min_size=0, max_size=12)
int64s = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
float32s = st.floats(width=32, allow_nan=False)
values = st.one_of(
    st.binary(max_size=40),
    int64s,
    st.lists(st.binary(max_size=20), min_size=1, max_size=4),
    st.lists(int64s, min_size=1, max_size=5),
    st.lists(float32s, min_size=1, max_size=5),
)
features = st.dictionaries(names, values, max_size=6)


def _prefix_free(feats) -> bool:
    # upb (Python protobuf) orders a map key after longer keys it prefixes; C++ protobuf and
    # packer sort plainly. The orders agree when no name prefixes another (ImageNet names).
    return not any(a != b and b.startswith(a) for a in feats for b in feats)


def _as_list(v):
    return list(v) if isinstance(v, list) else [v]


def _pb_of(feats) -> "example_pb2.Example":
    ex = example_pb2.Example()
    for name, v in feats.items():
        vals = _as_list(v)
        f = ex.features.feature[name]
        if isinstance(vals[0], bytes):
            f.bytes_list.value.extend(vals)
        elif isinstance(vals[0], int):
            f.int64_list.value.extend(vals)
        else:
            f.float_list.value.extend(vals)
    if not feats:
        ex.features.SetInParent()
    return ex


@settings(max_examples=150, deadline=None)
@given(features.filter(_prefix_free))
def test_encode_equals_protobuf_deterministic_serialization(feats):
    assert encode_example(feats) == _pb_of(feats).SerializeToString(deterministic=True)


@settings(max_examples=150, deadline=None)
@given(features)
def test_protobuf_reads_what_we_wrote(feats):
    ex = example_pb2.Example()
    ex.ParseFromString(encode_example(feats))
    assert ex == _pb_of(feats)


@settings(max_examples=150, deadline=None)
@given(features)
def test_decode_reads_what_protobuf_wrote(feats):
    decoded = decode_example(_pb_of(feats).SerializeToString())
    assert decoded == {k: _as_list(v) for k, v in feats.items()}


@settings(max_examples=100, deadline=None)
@given(st.lists(int64s, min_size=1, max_size=5))
def test_decode_accepts_unpacked_int64(vals):
    # Int64List written unpacked (one tag per value), as an old or foreign writer may do.
    from packer.codecs.protowire import encode_varint, field_bytes

    body = b"".join(encode_varint(1 << 3) + encode_varint(v) for v in vals)
    entry = field_bytes(1, b"k") + field_bytes(2, field_bytes(3, body))
    assert decode_example(field_bytes(1, field_bytes(1, entry))) == {"k": vals}


def test_decode_unpacked_float_and_unknown_fields():
    from packer.codecs.protowire import field_bytes, field_varint

    body = b"".join(bytes([0x0D]) + struct.pack("<f", x) for x in (1.0, -2.5))
    entry = field_bytes(1, b"f") + field_bytes(2, field_bytes(2, body)) + field_varint(9, 7)
    buf = field_bytes(1, field_bytes(1, entry)) + field_varint(5, 1)
    assert decode_example(buf) == {"f": [1.0, -2.5]}


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_raises_valueerror_or_parses(buf):
    try:
        decode_example(buf)
    except ValueError:
        pass


def test_bad_values_are_refused():
    with pytest.raises(ValueError):
        encode_example({"x": []})
    with pytest.raises(ValueError):
        encode_example({"x": [b"a", 1]})
    with pytest.raises(ValueError):
        encode_example({"x": 1 << 63})


def _outcome(fn, buf):
    try:
        return repr(fn(buf))  # repr: a damaged float may be NaN
    except ValueError:
        return "ValueError"


@settings(max_examples=300, deadline=None)
@given(features, st.data())
def test_fast_path_agrees_with_the_general_parser(feats, data):
    buf = encode_example(feats)
    assert decode_example(buf) == _decode_any(memoryview(buf))
    if buf:  # a damaged Example: the fast path never answers differently
        bad = bytearray(buf)
        pos = data.draw(st.integers(0, len(bad) - 1))
        bad[pos] = data.draw(st.integers(0, 255))
        cut = data.draw(st.integers(0, len(bad)))
        for b in (bytes(bad), bytes(bad[:cut])):
            assert _outcome(decode_example, b) == _outcome(lambda x: _decode_any(memoryview(x)), b)
