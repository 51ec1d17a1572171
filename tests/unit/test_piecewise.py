"""A large document decoded in pieces (`pubsub_filter.core.compare.piecewise`) is the value one decode gives, or
None, and then the whole decode answers: never a value where the whole decode fails."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub_filter.core.compare import piecewise
from pubsub_filter.core.compare.canonical import DECODE_ERRORS, canonical_decoder

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=20,
)
documents = st.dictionaries(st.text(max_size=4), st.lists(values, max_size=30) | values, max_size=4)


def whole(text: bytes) -> Any:
    try:
        return canonical_decoder.decode(text)
    except DECODE_ERRORS as exc:
        return type(exc)


@settings(max_examples=300)
@given(documents)
def test_a_document_in_pieces_is_the_value_of_one_decode(doc: dict[str, Any]) -> None:
    text = json.dumps(doc).encode()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(piecewise, "PIECE", 16)  # every array cut
        assert piecewise.decode_in_pieces(canonical_decoder, text) == whole(text)


@pytest.mark.parametrize(
    "text",
    [
        b'{"a":[1e400, 2]}',  # a number the canonical text refuses
        b'{"a":["\xff"]}',  # not UTF-8
        b'{"a":[1,2]} x',  # not one document
        b"[1,2]",  # not an object: decoded whole
        b'{"a":[1,' + b"[" * 2000 + b"]" * 2000 + b"]}",  # deeper than the decoder goes
    ],
)
def test_what_the_pieces_cannot_vouch_for_is_left_to_one_decode(text: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(piecewise, "PIECE", 1)
    assert piecewise.decode_in_pieces(canonical_decoder, text) is None


def test_duplicate_names_keep_the_last_value_as_one_decode_does() -> None:
    text = b'{"a":[1,2],"b":0,"a":[3]}'
    assert piecewise.decode_in_pieces(canonical_decoder, text) == canonical_decoder.decode(text) == {"a": [3], "b": 0}
