"""Fingerprints: what a message *is* and what its payload *says*. Pure functions, no I/O.

Two values per message:

* the message fingerprint covers the exact message (data bytes and attributes), and
* the payload fingerprint covers only the content that counts for the route: the
  selected fields of each row, rows in a defined order, in canonical JSON.

Schemes for the payload fingerprint:

``canonical`` (default)
    JSON decoded; rows taken from ``rows`` (or the payload itself); fields kept by
    ``include`` (all when empty) minus ``exclude``; rows ordered by ``row_key`` then by
    their canonical text; canonical JSON (object keys sorted, no whitespace, UTF-8);
    SHA-256. Numbers count by value, not spelling: an integral value is written as its
    exact integer in digits, whatever its size or spelling (``1.0``, ``1e0`` → ``1``;
    ``-0.0`` → ``0``; ``1e20`` → ``100000000000000000000``; ``9007199254740993.0`` →
    ``9007199254740993``, never rounded to a double); any other value is the nearest double,
    written as the shortest text that reads back to it (``25.50`` → ``25.5``), or as an
    integer if that double is integral (``0.99999999999999999999`` → ``1``). A number with a
    fraction or exponent whose nearest double is infinite (``1e400``), or an integer of more
    than 4300 digits, makes the payload raw (below). So the value depends only on the
    content, never on key order, row order, whitespace, the producer's number formatting
    or the Python version.
``data_hash``
    Seed 002's ``compute_data_hash``, bit for bit: rows sorted by ``row_key`` (the
    seed's UNIQUE_KEYS), fields other than ``exclude`` in sorted order, ``str()`` of
    each value joined with ``|``, rows joined with newlines.
``event``
    Seed 001's ``_hash_events``, bit for bit: per event the tuple (timestamp,
    account_id, product_id, side, str(price), quantity, event_type) (or the fields named
    in ``include``, in that order), sorted, ``json.dumps``-ed.

A payload that is not JSON is fingerprinted over its raw bytes (``payload_kind`` says so).
All values are written ``sha256:<64 hex>``; the seed schemes' hex part equals the seeds' own.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import islice
from operator import attrgetter, eq, itemgetter, lt
from typing import Any

import msgspec

from filter.core.config import Route
from filter.core.paths import MISSING

PREFIX = "sha256:"
SEED_EVENT_FIELDS = ("timestamp", "account_id", "product_id", "side", "price", "quantity", "event_type")
SEED_EXCLUDED = ("processed_at", "data_hash", "last_updated")


class PayloadError(ValueError):
    """The payload is JSON but does not have the shape the route describes."""


class NotJson:
    """Marker for a payload that is not JSON (fingerprinted over its raw bytes)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_JSON"


NOT_JSON = NotJson()


#: Below this magnitude every integer is a double and every integral double is exactly that integer.
_DOUBLE_EXACT = 2**53


def _canonical_number(text: str) -> float | int:
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


_canonical_decoder = msgspec.json.Decoder(float_hook=_canonical_number)
_plain_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder(order="sorted")
_encode = _encoder.encode
# For the typed fast path: its structs declare their fields already sorted by JSON name, and
# "deterministic" sorts dict keys but keeps struct fields in declaration order, which skips a
# per-row sort of field names and gives the same bytes as `_encode` on the equivalent dicts.
_encode_declared = msgspec.json.Encoder(order="deterministic").encode
# RecursionError: nested deeper than the decoder goes; such a payload is read as raw bytes.
_DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, ValueError, OverflowError, RecursionError)


def _hex(data: bytes) -> str:
    return PREFIX + hashlib.sha256(data).hexdigest()


def message_fingerprint(data: bytes, attributes: Mapping[str, str]) -> str:
    """The exact message: data bytes (length-prefixed) then the attributes in key order."""
    h = hashlib.sha256(len(data).to_bytes(8, "big"))
    h.update(data)
    h.update(_encode(dict(attributes)))
    return PREFIX + h.hexdigest()


def raw_fingerprint(data: bytes) -> str:
    return _hex(data)


@dataclass(frozen=True, slots=True)
class TypedRows:
    """Rows decoded by the fast path (structs of the included fields), and how to read them
    as the generic path's selected dicts would read: the key's JSON, the row's canonical JSON,
    the row as that dict."""

    rows: list[Any]
    key_json: Callable[[Any], bytes]
    content_json: Callable[[Any], bytes]
    as_dict: Callable[[Any], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Scheme:
    """A route's payload fingerprint: how to decode, then how to hash the decoded value.

    `fast`, when set, is tried first: it returns the same (payload, fingerprint) as the
    generic decode + digest, or None when it cannot vouch for that, and then the generic
    path runs. Its payload may hold only the top-level fields the route's key and bypass
    paths read (see `_typed_canonical`).
    """

    name: str
    decode: Callable[[bytes], Any]
    digest: Callable[[Any], str]
    fast: Callable[[bytes], tuple[Any, str] | None] | None = None
    #: The rows the fast path hashes, decoded its way, or None when it would not vouch for
    #: them: what `filter.core.rows` digests on a forward.
    typed_rows: Callable[[bytes], TypedRows | None] | None = None

    def __call__(self, data: bytes) -> tuple[Any, str]:
        """(decoded payload or NOT_JSON, fingerprint) for raw message data."""
        try:
            if self.fast is not None:
                done = self.fast(data)
                if done is not None:
                    return done
            payload = self.decode(data)
            if payload is NOT_JSON:
                return payload, raw_fingerprint(data)
            return payload, self.digest(payload)
        except RecursionError:
            # Decoded just under the depth limit, then too deep to sort, str() or encode.
            raise PayloadError("the payload is nested too deeply to fingerprint") from None


def _decoder(decoder: msgspec.json.Decoder[Any]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return decoder.decode(data)
        except _DECODE_ERRORS:
            return NOT_JSON

    return decode


def _rows(route: Route, payload: Any) -> list[Any]:
    """The list of records the route hashes: at `rows`, or the payload as one record."""
    if route.rows is None:
        return payload if isinstance(payload, list) else [payload]
    rows = route.rows.resolve(payload, {})
    if rows is MISSING:
        raise PayloadError(f"{route.rows} is missing from the payload")
    if not isinstance(rows, list):
        raise PayloadError(f"{route.rows} is a {type(rows).__name__}, not a list of rows")
    return rows


def _selector(route: Route) -> Callable[[Any], Any]:
    exclude = frozenset(route.exclude)
    include = tuple(k for k in route.include if k not in exclude)
    if include:

        def select(row: Any) -> Any:
            if type(row) is not dict:
                return row
            return {k: row[k] for k in include if k in row}

    elif exclude:

        def select(row: Any) -> Any:
            if type(row) is not dict:
                return row
            return {k: v for k, v in row.items() if k not in exclude}

    else:

        def select(row: Any) -> Any:
            return row

    return select


def _ordered(
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


def _canonical(route: Route) -> Callable[[Any], str]:
    select = _selector(route)
    row_key = tuple(route.row_key)
    ordered = _ordered(itemgetter(*row_key) if row_key else None, lambda r: [_get(r, k) for k in row_key], _encode)

    if route.rows is None:

        def digest(payload: Any) -> str:
            if isinstance(payload, list):
                return _hex(ordered([select(r) for r in payload]))
            return _hex(_encode(select(payload)))

        return digest

    def digest_rows(payload: Any) -> str:
        return _hex(ordered([select(r) for r in _rows(route, payload)]))

    return digest_rows


_Fast = Callable[[bytes], tuple[Any, str] | None]
_TypedRowsOf = Callable[[bytes], TypedRows | None]


def _typed_canonical(route: Route) -> tuple[_Fast, _TypedRowsOf] | None:
    """The canonical scheme's fast path for the common route shape, or None when it does not apply.

    Shape: `rows: payload.NAME`, an `include` list that covers every `row_key` field, and
    no key or bypass path that reads inside the rows. Where the time goes otherwise: the
    generic path materialises every field of every row (a 450-row injury report has 21
    fields a row, 7 of them included), then copies the included ones into new dicts.
    Here msgspec decodes straight into structs that declare only the included fields, so
    the others are skipped in C and never become Python objects; rows are not copied.

    Same values as the generic path, by construction:

    * fields are `object`-typed, so values decode exactly as the generic decoder decodes
      them (same float hook: integral floats become ints); an absent field is UNSET and
      is omitted when encoded, a JSON null is None and is written `null`, as before;
    * row key fields are required: a row without one fails to decode, and the generic
      path (which orders such rows by their encoded text) takes the message;
    * anything the structs do not accept (rows that are not objects, `rows` missing or
      not a list, a payload that is not an object, malformed JSON) falls back to the
      generic path, which gives the answer, or the error, it always gave;
    * msgspec does not check the UTF-8 of strings it skips, the generic decoder does: a
      payload that is not ASCII is UTF-8-checked first (a few µs) and falls back if invalid.

    One divergence is left on purpose: a number the canonical text refuses (an integer of
    more than 4300 digits, msgspec's and CPython's limit; a fraction or exponent beyond
    double range, `1e400`) inside a *skipped* field makes the generic decoder call the
    payload "not JSON"; here it is skipped unread like any other skipped field. Finding
    one means scanning every byte (a regex costs about half the fast path on 450 rows).

    The payload returned holds only the top-level fields the route's key and bypass paths
    read: they are the only readers of the payload (`RouteRules.key_of`, `bypassed`).
    """
    if route.rows is None or len(route.rows.parts) != 1 or not route.include:
        return None
    rows_name = route.rows.parts[0]
    exclude = frozenset(route.exclude)
    fields = sorted({k for k in route.include if k not in exclude})
    if not fields or not set(route.row_key) <= set(fields):
        return None
    readers = [p for p in (*route.key, *(c.field for c in route.bypass)) if p.root == "payload"]
    if any(not p.parts or p.parts[0] == rows_name for p in readers):
        return None
    top_names = sorted({p.parts[0] for p in readers})

    # Python attribute names are generated (f0, f1, ...): JSON names need not be identifiers.
    row_attrs = {name: f"f{i}" for i, name in enumerate(fields)}
    row_type = msgspec.defstruct(
        "Row",
        [
            (attr, object) if name in route.row_key else (attr, object, msgspec.UNSET)
            for name, attr in row_attrs.items()
        ],
        rename={attr: name for name, attr in row_attrs.items()},
        kw_only=True,  # required key fields may come after optional ones: keep the sorted order
        gc=False,  # decoded JSON cannot form reference cycles
    )
    top_attrs = {name: f"t{i}" for i, name in enumerate(top_names)}
    top_type = msgspec.defstruct(
        "Top",
        [("rows", list[row_type], msgspec.UNSET)]  # type: ignore[valid-type]
        + [(attr, object, msgspec.UNSET) for attr in top_attrs.values()],
        rename={"rows": rows_name, **{attr: name for name, attr in top_attrs.items()}},
        gc=False,
    )
    decode = msgspec.json.Decoder(top_type, float_hook=_canonical_number).decode
    key_attrs = tuple(row_attrs[k] for k in route.row_key)
    key_of = attrgetter(*key_attrs) if key_attrs else None
    ordered = _ordered(
        key_of,
        (lambda r: (getattr(r, key_attrs[0]),)) if len(key_attrs) == 1 else key_of,  # type: ignore[arg-type]
        _encode_declared,
    )
    top_get = tuple(top_attrs.items())
    # The last message's rows in arrival order, for `typed_rows` on the same bytes: a forward
    # on a route with row state digests the rows the fingerprint just decoded, instead of
    # decoding the document again. One entry, replaced as a whole (safe across threads); a
    # miss only costs the decode. Kept only where row state can be asked for (a row key).
    last: tuple[bytes, list[Any]] | None = None
    remember = bool(key_attrs)

    def decode_top(data: bytes) -> Any:
        """The typed document, or None where the generic path must decide (not UTF-8, not this shape)."""
        try:
            if not data.isascii():
                data.decode()
            return decode(data)
        except _DECODE_ERRORS:
            return None

    def fast(data: bytes) -> tuple[Any, str] | None:
        nonlocal last
        top = decode_top(data)
        if top is None:
            return None
        rows = top.rows
        if rows is msgspec.UNSET:
            return None
        payload = {name: v for name, attr in top_get if (v := getattr(top, attr)) is not msgspec.UNSET}
        arrival = list(rows) if remember else rows
        digest = _hex(ordered(rows))
        if remember:
            last = (data, arrival)
        return payload, digest

    row_get = tuple(row_attrs.items())
    unset = msgspec.UNSET

    def as_dict(r: Any) -> dict[str, Any]:
        return {name: v for name, attr in row_get if (v := getattr(r, attr)) is not unset}

    key_json: Callable[[Any], bytes]
    if len(key_attrs) == 1:
        only = attrgetter(key_attrs[0])
        key_json = lambda r: _encode((only(r),))  # noqa: E731
    elif key_attrs:
        several = attrgetter(*key_attrs)
        key_json = lambda r: _encode(several(r))  # noqa: E731
    else:
        key_json = lambda r: b"[]"  # noqa: E731

    def typed_rows(data: bytes) -> TypedRows | None:
        # Exactly the rows `fast` hashes: the same checks, the same decode.
        nonlocal last
        seen = last
        if seen is not None and seen[0] is data:
            last = None  # freed with the forward that used it, not by the next message
            return TypedRows(seen[1], key_json, _encode_declared, as_dict)
        top = decode_top(data)
        if top is None or top.rows is msgspec.UNSET:
            return None
        return TypedRows(top.rows, key_json, _encode_declared, as_dict)

    return fast, typed_rows


def _get(row: Any, key: str) -> Any:
    return row.get(key) if isinstance(row, dict) else None


def _data_hash(route: Route) -> Callable[[Any], str]:
    unique_keys = tuple(route.row_key)
    excluded = frozenset(route.exclude)
    include = frozenset(route.include) if route.include else None

    def digest(payload: Any) -> str:
        rows = [r for r in _rows(route, payload) if isinstance(r, dict)]
        if include is not None:
            rows = [{k: v for k, v in r.items() if k in include} for r in rows]
        sort_key: Callable[[dict[str, Any]], Any] = lambda r: tuple(r.get(k) for k in unique_keys)  # noqa: E731
        try:
            rows = sorted(rows, key=sort_key)
        except TypeError:
            # The seed would crash on mixed types (e.g. None and str); order by text instead.
            rows = sorted(rows, key=lambda r: tuple(str(r.get(k)) for k in unique_keys))
        lines = ["|".join(str(r.get(k, "")) for k in sorted(r.keys()) if k not in excluded) for r in rows]
        return _hex("\n".join(lines).encode("utf-8"))

    return digest


def _event(route: Route) -> Callable[[Any], str]:
    fields: Sequence[str] = tuple(route.include) or SEED_EVENT_FIELDS

    def signature(event: Any) -> tuple[Any, ...]:
        if not isinstance(event, dict):
            raise PayloadError("scheme 'event' needs each row to be a JSON object")
        return tuple(str(event.get(f)) if f == "price" else event.get(f) for f in fields)

    def digest(payload: Any) -> str:
        signatures = [signature(e) for e in _rows(route, payload)]
        try:
            signatures.sort()
        except TypeError:
            signatures.sort(key=lambda s: json.dumps(s))
        return _hex(json.dumps(signatures).encode())

    return digest


def compile_scheme(route: Route) -> Scheme:
    """Build the route's payload fingerprint once; call it per message."""
    if route.scheme == "canonical":
        typed = _typed_canonical(route)
        fast, selected = typed if typed is not None else (None, None)
        return Scheme("canonical", _decoder(_canonical_decoder), _canonical(route), fast, selected)
    if route.scheme == "data_hash":
        return Scheme("data_hash", _decoder(_plain_decoder), _data_hash(route))
    return Scheme("event", _decoder(_plain_decoder), _event(route))
