"""``object_members`` reads a JSON object member by member (its big arrays element by element)
through a bounded buffer and gives exactly what ``json.loads`` gives, or a ValueError wherever
``json.loads`` refuses the text, whatever the buffer's size and the text's whitespace."""
from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.codecs.json_stream import Elements, object_members

SCALARS = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False) | st.text(max_size=8)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                           max_size=4), max_leaves=12)
OBJECTS = st.dictionaries(st.sampled_from(["images", "annotations", "info", "x", "ü"]) | st.text(max_size=5), VALUES,
                          max_size=6)


def _read(text: str, chunk: int, stream=("images", "annotations")) -> dict:
    out = {}
    for key, value in object_members(io.StringIO(text), stream=stream, chunk=chunk):
        out[key] = list(value) if isinstance(value, Elements) else value
    return out


@settings(max_examples=300)
@given(OBJECTS, st.integers(1, 64), st.sampled_from([None, 0, 2]), st.booleans())
def test_members_are_what_json_loads_gives(obj, chunk, indent, ascii_only):
    text = json.dumps(obj, indent=indent, ensure_ascii=ascii_only)
    assert _read(text, chunk) == json.loads(text)


@settings(max_examples=300)
@given(OBJECTS, st.integers(1, 64), st.data())
def test_a_cut_or_damaged_text_is_a_value_error_where_json_loads_refuses_it(obj, chunk, data):
    text = json.dumps(obj, indent=1)
    at = data.draw(st.integers(0, len(text)))
    damaged = data.draw(st.sampled_from([text[:at], text[:at] + "," + text[at:], text[:at] + "}" + text[at:],
                                         text[:at] + text[at + 1:], text[:at] + '"x":1,' + text[at:]]))
    try:
        want = json.loads(damaged)
    except ValueError:
        want = ValueError
    try:
        got = _read(damaged, chunk)
    except ValueError:
        got = ValueError
    if not isinstance(want, dict) or _repeats(damaged):  # not an object, or a key json.loads would replace
        assert got is ValueError
    else:
        assert got == want


def _repeats(text: str) -> bool:
    """Whether the top-level object of ``text`` names a key twice."""
    keys = [k for k, _ in json.loads(text, object_pairs_hook=lambda pairs: pairs)]
    return len(keys) != len(set(keys))


def test_an_array_not_read_to_its_end_is_skipped_and_checked():
    text = '{"images": [1, 2, 3], "after": 4}'
    members = object_members(io.StringIO(text), stream=["images"], chunk=2)
    key, elements = next(members)
    assert key == "images" and next(elements) == 1
    assert next(members) == ("after", 4)
    with pytest.raises(ValueError, match="Expecting value at character 18"):
        for _key, value in object_members(io.StringIO('{"images": [1, 2, ], "after": 4}'), stream=["images"]):
            pass


@pytest.mark.parametrize("text, message", [
    ("", "Expecting '{'"), ("[1]", "Expecting '{'"), ('{"a": 1', "Expecting ',' delimiter"),
    ('{"a": 1} 2', "Extra data at character 9"), ('{"a" 1}', "Expecting ':' delimiter"),
    ('{"a": 1, "a": 2}', "the key 'a' appears twice at character 9"), ("{1: 2}", "property name"),
    ('{"images": [1 2]}', "Expecting ',' delimiter at character 14"),
])
def test_errors_name_the_character(text, message):
    with pytest.raises(ValueError, match=message):
        _read(text, 3)


@pytest.mark.parametrize("chunk", range(1, 12))
def test_a_number_cut_by_the_buffer_is_read_whole(chunk):
    text = '{"images": [123456789, 0.000125, 1e5, -2.5E-3], "n": 98765, "x": 10.0\n}'
    assert _read(text, chunk) == json.loads(text)
