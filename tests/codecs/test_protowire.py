"""The protobuf wire codec, checked against the real protobuf runtime (an independent decoder)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.codecs.protowire import decode_datum, decode_varint, encode_datum, encode_varint, iter_fields
from tests.support.protobuf import Datum

datums = st.tuples(st.binary(max_size=300), st.integers(-2**31, 2**31 - 1),
                   st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1),
                   st.booleans())


@settings(max_examples=200, deadline=None)
@given(datums)
def test_datum_matches_protobuf_runtime(d):
    data, label, h, w, c, enc = d
    ours = encode_datum(data, label, h, w, c, encoded=enc)
    ref = Datum()
    ref.ParseFromString(ours)
    assert (ref.data, ref.label, ref.height, ref.width, ref.channels, ref.encoded) == (data, label, h, w, c, enc)
    # and the other way: protobuf's own serialization is identical and parses back with ours
    theirs = Datum(data=data, label=label, height=h, width=w, channels=c, encoded=enc).SerializeToString()
    assert theirs == ours
    back = decode_datum(theirs)
    assert (back.data, back.label, back.height, back.width, back.channels, back.encoded) == (data, label, h, w, c, enc)


def test_decode_skips_unknown_fields():
    ref = Datum(data=b"xyz", label=3, float_data=[1.0, 2.0])
    d = decode_datum(ref.SerializeToString())
    assert d.data == b"xyz" and d.label == 3


@given(st.integers(0, 2**64 - 1))
def test_varint_round_trip(v):
    buf = encode_varint(v)
    assert decode_varint(buf, 0) == (v, len(buf))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_raises_valueerror_or_parses(buf):
    try:
        list(iter_fields(buf))
    except ValueError:
        pass


@pytest.mark.parametrize("buf", [b"\x22\x05ab", b"\x80", b"\x00\x01", b"\x0b"])
def test_malformed_raise(buf):
    with pytest.raises(ValueError):
        decode_datum(buf)


def _datum_by_fields(buf: bytes) -> tuple:
    """The Datum ``iter_fields`` (the generic parser) reads from ``buf``: the reference."""
    got = {1: 0, 2: 0, 3: 0, 5: 0, 7: 0}
    data = b""
    for number, wtype, value in iter_fields(buf):
        if number == 4 and wtype == 2:
            data = bytes(value)
        elif wtype == 0 and number in got:
            got[number] = value
    i32 = [(v & 0xFFFFFFFF) - ((v & 0x80000000) << 1) for v in (got[5], got[2], got[3], got[1])]
    return (data, *i32, bool(got[7]))


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=64),
                 datums.map(lambda d: encode_datum(d[0], d[1], d[2], d[3], d[4], encoded=d[5])),
                 st.tuples(datums, st.binary(max_size=12)).map(
                     lambda t: encode_datum(*t[0][:5], encoded=t[0][5]) + t[1])))
def test_decode_datum_reads_what_iter_fields_reads(buf):
    """decode_datum's one loop accepts, refuses and reads exactly what the generic parser does."""
    try:
        want = _datum_by_fields(buf)
    except ValueError:
        with pytest.raises(ValueError):
            decode_datum(buf)
        return
    assert tuple(decode_datum(buf)) == want
    assert tuple(decode_datum(memoryview(buf))) == want


@settings(max_examples=200, deadline=None)
@given(datums)
def test_datum_pieces_join_to_the_datum(d):
    """The pieces a writer puts one after the other are the Datum's bytes, the data in the middle."""
    from packer.codecs.protowire import datum_pieces

    data, label, h, w, c, enc = d
    pieces = datum_pieces(data, label, h, w, c, encoded=enc)
    assert b"".join(pieces) == encode_datum(data, label, h, w, c, encoded=enc) and pieces[1] == data
