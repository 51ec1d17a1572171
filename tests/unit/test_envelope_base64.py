"""`message.data` decoded by pybase64 accepts, rejects and reads exactly what msgspec's decoding did.

The reference is `parse_envelope` with its pybase64 path switched off: the msgspec-only
decoding the product used before, which gives every answer and error text a push client sees.
"""

from __future__ import annotations

import base64
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub_filter.core import envelope
from pubsub_filter.core.envelope import EnvelopeError, make_envelope, parse_envelope
from tests.support.payloads import injury_report


def outcome(body: bytes) -> object:
    """What a push client gets from the body: the message, or the rejection and the id it names."""
    try:
        return parse_envelope(body)
    except EnvelopeError as exc:
        return ("rejected", str(exc), exc.message_id)


def reference(body: bytes) -> object:
    with mock.patch.object(envelope, "_fast_decode", return_value=None):
        return outcome(body)


def with_data(text: bytes, before: bytes = b"", after: bytes = b'"messageId": "m-1"') -> bytes:
    """An envelope whose `data` is the given JSON text, spelled exactly as given."""
    return b'{"message": {' + before + b'"data": ' + text + b", " + after + b'}, "subscription": "s"}'


EDGE_CASES = {
    "padded": b'"eyJhIjogMX0="',
    "unpadded": b'"eyJhIjogMX0"',
    "one pad short": b'"QQ="',
    "too much padding": b'"QQ==="',
    "padding only": b'"===="',
    "non-zero trailing bits": b'"QR=="',
    "url-safe alphabet": b'"-_-_"',
    "url-safe mixed in": b'"ab-c"',
    "space inside": b'"QU JD"',
    "escaped newline inside": b'"QUJD\\nREVG"',
    "escaped tab at the end": b'"QUJD\\t"',
    "= inside": b'"QQ==QQ=="',
    "= in the middle of a quad": b'"Q=Q="',
    "empty": b'""',
    "null": b"null",
    "non-ASCII": '"QUJDé"'.encode(),
    "non-ASCII as an escape": b'"QUJD\\u00e9"',
    "escaped solidus": b'"ab\\/c"',
    "escaped letter": b'"\\u0051Q=="',
    "invalid UTF-8": b'"QUJD\xff"',
    "a number": b"5",
    "an object": b'{"a": "QQ=="}',
    "a list": b'["QQ=="]',
    "true": b"true",
    "unterminated": b'"QUJD',
}


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_data_edge_case_gets_the_reference_answer(case: str) -> None:
    body = with_data(EDGE_CASES[case])
    assert outcome(body) == reference(body)


def test_invalid_base64_is_rejected_naming_the_message() -> None:
    assert outcome(with_data(b'"***"')) == ("rejected", "message.data is not valid base64", "m-1")


def test_invalid_base64_without_a_message_id_is_rejected_as_base64() -> None:
    body = b'{"message": {"data": "***"}}'
    assert outcome(body) == reference(body) == ("rejected", "message.data is not valid base64", None)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (b'"attributes": {"a": 1}, ', b'"messageId": "m-1"'),
        (b"", b'"attributes": {"a": 1}, "messageId": "m-1"'),
        (b"", b'"messageId": "m-1", "publishTime": "yesterday"'),
        (b"", b'"messageId": 7'),
        (b"", b'"messageId": "m-1"} nope'),
    ],
    ids=["bad attributes first", "bad attributes after", "bad publish time", "id not a string", "not JSON after"],
)
def test_bad_data_next_to_another_fault_gets_the_reference_reason(before: bytes, after: bytes) -> None:
    for text in (b'"***"', b'"QQ=="'):
        body = with_data(text, before, after)
        assert outcome(body) == reference(body)


def test_bad_data_with_a_bad_delivery_attempt_gets_the_reference_reason() -> None:
    for text in (b'"***"', b'"QQ=="'):
        for body in (
            b'{"deliveryAttempt": -1, "message": {"data": ' + text + b', "messageId": "m"}}',
            b'{"message": {"data": ' + text + b', "messageId": "m"}, "deliveryAttempt": -1}',
        ):
            assert outcome(body) == reference(body)


def test_a_message_without_data_reads_as_empty() -> None:
    body = b'{"message": {"messageId": "m-1", "attributes": {"k": "v"}}}'
    assert outcome(body) == reference(body)
    assert parse_envelope(body).data == b""


def test_a_report_as_pubsub_sends_it_is_decoded_by_pybase64() -> None:
    data = str(injury_report(450)).encode()
    body = make_envelope(data, "m-1")
    fast = envelope._fast_decode(body)
    assert fast is not None and fast[1] == data
    assert parse_envelope(body) == reference(body)


# JSON text of `data` built from the pieces an encoder or an attacker could put there.
_ASCII = [
    b"A",
    b"Q",
    b"g",
    b"w",
    b"/",
    b"+",
    b"=",
    b"==",
    b"-",
    b"_",
    b" ",
    b"\\n",
    b"\\/",
    b"\\u0041",
    b"\\\\",
    b'\\"',
]
_PIECES = st.sampled_from([*_ASCII, "é".encode(), b"\xff"])  # and non-ASCII: UTF-8, and not UTF-8
_BASE64 = st.binary(max_size=40).map(base64.b64encode)


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.one_of(_PIECES, _BASE64), max_size=12))
def test_any_data_text_gets_the_reference_answer(pieces: list[bytes]) -> None:
    body = with_data(b'"' + b"".join(pieces) + b'"')
    assert outcome(body) == reference(body)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(_PIECES, _BASE64), max_size=12), st.booleans())
def test_a_body_gathered_in_parts_reads_as_the_same_bytes_would(pieces: list[bytes], quoted: bool) -> None:
    """A body read in parts is decoded from the `bytearray` it was gathered in: the same message,
    its data `bytes`, or the same rejection, word for word."""
    text = b"".join(pieces)
    body = with_data(b'"' + text + b'"' if quoted else text or b"null")
    gathered = outcome(bytearray(body))
    assert gathered == outcome(body)
    if not isinstance(gathered, tuple):
        assert type(parse_envelope(bytearray(body)).data) is bytes
