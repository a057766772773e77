"""The fingerprint's input digests: the fast row encoding gives exactly the documented lines
(``json.dumps(row, ensure_ascii=False)`` per input), so a resume of a partial made by an
earlier version compares equal."""
from __future__ import annotations

import hashlib
import json

from hypothesis import given, settings, strategies as st

from packer.conversion.fingerprint import Fingerprint
from packer.formats.writer import _json_str


def _reference(rows):
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogateescape") + b"\n")
    return h.hexdigest()


_label = st.one_of(st.integers(-5, 10**12), st.lists(st.integers(0, 999), max_size=4), st.booleans())
_row = st.tuples(st.text(), _label, st.integers(-1, 10**15), st.integers(-1, 10**19)).map(list)


@settings(max_examples=300, deadline=None)
@given(st.lists(_row, max_size=30))
def test_input_digests_equal_the_documented_json_lines(rows):
    fp = Fingerprint(format="lmdb", classes=["a"], options={}, stats=rows)
    assert fp.inputs["files_sha256"] == _reference(rows)
    assert fp.inputs["sha256"] == _reference(row[:2] for row in rows)
    assert fp.inputs["count"] == len(rows)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_keys_journal_lines_are_json_strings(key):
    assert _json_str(key) == json.dumps(key)
    assert json.loads(_json_str(key)) == key
