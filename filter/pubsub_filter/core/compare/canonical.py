"""Canonical JSON, the primitives every fingerprint is made of: the number rule, the
decoders and encoders, the `sha256:` form, and the content-only order of rows.

The rules themselves are stated in `pubsub_filter.core.compare.fingerprint`'s docstring; the golden vectors
(`tests/golden/fingerprints.json`) pin what they produce.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from decimal import Decimal
from itertools import islice
from operator import eq, lt
from typing import Any

import msgspec

from pubsub_filter.core.errors import FilterError

PREFIX = "sha256:"


class PayloadError(FilterError, ValueError):
    """The payload is JSON but does not have the shape the route describes."""


class MissingField(PayloadError):
    """A path the route keys on cannot be read from this message: a key field absent, null or
    not a value, a payload key on a payload that is not JSON, or `rows` that are not a list.
    The route's `on_missing_key` decides: forward it without a dedup decision, or reject it."""

    def __init__(self, path: str, problem: str):
        super().__init__(problem)
        self.path = path

    def __reduce__(self) -> tuple[type[MissingField], tuple[str, str]]:
        # pickled across to the large-message process and back (`pubsub_filter.core.engine.lane_process`):
        # the default would call `MissingField(problem)` alone
        return MissingField, (self.path, str(self))


class NotJson:
    """Marker for a payload that is not JSON (fingerprinted over its raw bytes)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_JSON"


NOT_JSON = NotJson()


#: Below this magnitude every integer is a double and every integral double is exactly that integer.
_DOUBLE_EXACT = 2**53


def canonical_number(text: str) -> float | int:
    """The canonical value of a JSON number written with a fraction or an exponent.

    Integral values are exact ints (`1e20`, `9007199254740993.0`), so they are written as the
    same digits as the integer literal; other values are the nearest double, an int if that
    double is integral. Integer literals never come here: msgspec decodes them to exact ints.
    """
    value = float(text)
    if value.is_integer():
        if -_DOUBLE_EXACT < value < _DOUBLE_EXACT:
            return int(value)  # the double is the exact value, or the value rounds to it
        # Past 2**53 the double may not be the value (9007199254740993.0 reads as ...992.0).
        exact = Decimal(text)
        return int(exact) if exact == exact.to_integral_value() else int(value)
    if not math.isfinite(value):
        # 1e400 overflows to inf, which canonical JSON can only write as null: 1e400, -1e400 and
        # null would then be one value. Such a payload is fingerprinted over its raw bytes instead.
        raise ValueError(f"number {text} is beyond double range")
    return value


def wide_number(text: str) -> float | int | Decimal:
    """`canonical_number`, and a number beyond double range (`1e400`) as its exact decimal,
    trailing zeros dropped (`10e399` is `1E+400`): how the decision reads a payload whose
    fingerprint is over its raw bytes for such a number (`Scheme.readable`). Never an int: an
    exponent can be any size, and the decimal holds it in as many digits as it was written."""
    try:
        return canonical_number(text)
    except ValueError:
        sign, digits, exponent = Decimal(text).as_tuple()
        assert isinstance(exponent, int)  # a JSON number: never NaN or infinite
        kept = len(digits)
        while kept > 1 and digits[kept - 1] == 0:
            kept -= 1
        return Decimal((sign, digits[:kept], exponent + len(digits) - kept))


def _as_written(text: str) -> float | Decimal:
    value = float(text)
    return value if math.isfinite(value) else Decimal(text)


_spelled_decoder = msgspec.json.Decoder(float_hook=_as_written)
#: What writes a payload read by `plain_decode` back: a number beyond double range as the number.
plain_encode = msgspec.json.Encoder(decimal_format="number").encode


def plain_decode(data: bytes | str) -> Any:
    """JSON as msgspec reads it plainly (what a forward sends on as its payload, `partial`), and
    a number beyond double range, which msgspec refuses, as its decimal (`plain_encode` writes it
    back as the number it was), never a failed decision."""
    try:
        return msgspec.json.decode(data)
    except msgspec.ValidationError:
        return _spelled_decoder.decode(data)


canonical_decoder = msgspec.json.Decoder(float_hook=canonical_number)
wide_decoder = msgspec.json.Decoder(float_hook=wide_number)
plain_decoder = msgspec.json.Decoder()
# A Decimal (only ever a number beyond double range, `wide_number`) is written as the JSON
# number it is, never as a string that a string value could equal. No fingerprint meets one:
# a payload holding such a number is fingerprinted over its bytes.
sorted_encoder = msgspec.json.Encoder(order="sorted", decimal_format="number")
encode_sorted = sorted_encoder.encode
# For the typed fast path: its structs declare their fields already sorted by JSON name, and
# "deterministic" sorts dict keys but keeps struct fields in declaration order, which skips a
# per-row sort of field names and gives the same bytes as `encode_sorted` on the equivalent dicts.
encode_declared = msgspec.json.Encoder(order="deterministic").encode
# RecursionError: nested deeper than the decoder goes; such a payload is read as raw bytes.
DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, ValueError, OverflowError, RecursionError)


def json_kind(value: Any) -> str:
    """What a decoded JSON value is, in JSON's words (a reason names it, never a Python type):
    `null`, `true`, `false`, `a number`, `a string`, `an object` or `a list`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "an object"
    return "a list" if isinstance(value, list) else "not a JSON value"


def hex_fingerprint(data: bytes) -> str:
    return PREFIX + hashlib.sha256(data).hexdigest()


class TypedRows(msgspec.Struct, frozen=True):
    """Rows decoded by the fast path (structs of the included fields), and how to read them
    as the generic path's selected dicts would read: the key's JSON, the row's canonical JSON,
    the row as that dict. A frozen msgspec Struct: the fingerprint builds one per message on a
    rows route (`fingerprint_fast`), and a frozen dataclass of six fields costs ten times more."""

    rows: list[Any]
    key_json: Callable[[Any], bytes]
    content_json: Callable[[Any], bytes]
    as_dict: Callable[[Any], dict[str, Any]]
    #: Every row's key values as a tuple, in row order, in one pass: the tuples encode as `key_json` does.
    keys: Callable[[list[Any]], list[tuple[Any, ...]]]
    #: The fingerprint's canonical text of these rows, when they are the rows it just hashed
    #: (`pubsub_filter.core.compare.forwarded_rows` reads its length, and whether it holds `true` or `false`).
    canonical: bytes | None = None


def ordered_rows(
    by_key: Callable[[Any], Any] | None, key_values: Callable[[Any], Any], encode: Callable[[Any], bytes]
) -> Callable[[list[Any]], bytes]:
    """Canonical JSON of a list of rows, in an order that depends only on content.

    With a row key: rows sorted by it, unless a key is missing, keys do not compare, or two
    rows share a key; then (only then) the total order by (encoded key, encoded row).
    """

    def ordered(rows: list[Any]) -> bytes:
        if by_key is not None:
            try:
                keys = list(map(by_key, rows))
                # Rows already in strictly ascending key order (a producer's stable order) are
                # what the sort would return: skip it. The check compares the adjacent pairs the
                # sort compares first, so it raises TypeError exactly when the sort would.
                if all(map(lt, keys, islice(keys, 1, None))):
                    return encode(rows)
                rows.sort(key=by_key)
                keys = list(map(by_key, rows))
                # Equal keys would leave those rows in arrival order: only then pay for the total order.
                if not any(map(eq, keys, islice(keys, 1, None))):
                    return encode(rows)
            except (TypeError, KeyError):
                pass  # missing key fields or mixed types: fall through to the total order
            encoded = sorted((encode(key_values(r)), encode(r)) for r in rows)
            return b"[" + b",".join(e for _, e in encoded) + b"]"
        return b"[" + b",".join(sorted(map(encode, rows))) + b"]"

    return ordered
