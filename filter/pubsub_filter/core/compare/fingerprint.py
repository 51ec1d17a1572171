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

A payload that is not JSON is fingerprinted over its raw bytes (``payload_kind`` says so). So
is one holding a number beyond double range in the content the route counts; in a field it
leaves out, the number does not count, and the fingerprint is by value (`_by_value`). Either
way the decision still reads the payload (`Scheme.readable`): its key, rows and fields are
found, and a repeat is deduplicated.
All values are written ``sha256:<64 hex>``; the seed schemes' hex part equals the seeds' own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from operator import itemgetter
from typing import Any

import msgspec

from pubsub_filter.core.compare.canonical import (
    DECODE_ERRORS,
    NOT_JSON,
    PREFIX,
    MissingField,
    NotJson,
    PayloadError,
    TypedRows,
    canonical_decoder,
    encode_sorted,
    hex_fingerprint,
    json_kind,
    ordered_rows,
    plain_decoder,
    wide_decoder,
)
from pubsub_filter.core.compare.fingerprint_fast import typed_canonical
from pubsub_filter.core.compare.piecewise import PIECEWISE_BYTES, decode_in_pieces
from pubsub_filter.core.config.schema import Route
from pubsub_filter.core.paths import MISSING

__all__ = [
    "NOT_JSON",
    "PREFIX",
    "NotJson",
    "PayloadError",
    "Scheme",
    "TypedRows",
    "compile_scheme",
    "message_fingerprint",
    "raw_fingerprint",
]

SEED_EVENT_FIELDS = ("timestamp", "account_id", "product_id", "side", "price", "quantity", "event_type")
SEED_EXCLUDED = ("processed_at", "data_hash", "last_updated")


def message_fingerprint(data: bytes, attributes: Mapping[str, str]) -> str:
    """The exact message: data bytes (length-prefixed) then the attributes in key order."""
    h = hashlib.sha256(len(data).to_bytes(8, "big"))
    h.update(data)
    h.update(encode_sorted(dict(attributes)))
    return PREFIX + h.hexdigest()


def raw_fingerprint(data: bytes) -> str:
    return hex_fingerprint(data)


@dataclass(frozen=True, slots=True)
class Scheme:
    """A route's payload fingerprint: how to decode, then how to hash the decoded value.

    `fast`, when set, is tried first: it returns the same (payload, fingerprint) as the
    generic decode + digest, with the rows it hashed, or None when it cannot vouch for that,
    and then the generic path runs. Its payload may hold only the top-level fields the
    route's key and bypass paths read (see `typed_canonical`).
    """

    name: str
    decode: Callable[[bytes], Any]
    digest: Callable[[Any], str]
    fast: Callable[[bytes], tuple[Any, str, TypedRows | None] | None] | None = None
    #: The rows the fast path hashes, decoded its way, or None when it would not vouch for
    #: them: what `pubsub_filter.core.compare.rows` digests on a forward when the rows
    #: `with_rows` gave are not at hand.
    typed_rows: Callable[[bytes], TypedRows | None] | None = None
    #: The payload as the decision reads it when the fingerprint is over the raw bytes
    #: (`readable`); None: the same as `decode`.
    wide: Callable[[bytes], Any] | None = None
    #: The fingerprint of such a payload by value, when the route counts none of what made it
    #: raw (`_by_value`); None: over its bytes
    by_value: Callable[[Any], str | None] | None = None

    def readable(self, data: bytes) -> Any:
        """The payload the decision reads (its key, bypass rules, fields, rows, tolerance) when
        `__call__` gave `NOT_JSON`: valid JSON holding a number beyond double range (`1e400`)
        decodes, that number as its exact decimal (`canonical.wide_number`); the fingerprint
        stays the one over its bytes. `NOT_JSON` for anything that is not JSON."""
        return (self.wide or self.decode)(data)

    def __call__(self, data: bytes) -> tuple[Any, str]:
        """(decoded payload or NOT_JSON, fingerprint) for raw message data."""
        payload, fp, _ = self.with_rows(data)
        return payload, fp

    def with_rows(self, data: bytes) -> tuple[Any, str, TypedRows | None]:
        """`__call__`'s (payload, fingerprint), and the rows the fast path decoded to hash them
        (what a forward's row digests read: `RouteRules.extract`); None off the fast path, or
        on a route without a row key."""
        try:
            if self.fast is not None:
                done = self.fast(data)
                if done is not None:
                    return done
            payload = self.decode(data)
            if payload is NOT_JSON:
                if self.wide is not None and self.by_value is not None:
                    # JSON with a number beyond double range: by value unless the route counts it
                    wide = self.wide(data)
                    if wide is not NOT_JSON and (value := self.by_value(wide)) is not None:
                        return wide, value, None
                return payload, raw_fingerprint(data), None
            return payload, self.digest(payload), None
        except RecursionError:
            # Decoded just under the depth limit, then too deep to sort, str() or encode.
            raise PayloadError("the payload is nested too deeply to fingerprint") from None


def _decoder(decoder: msgspec.json.Decoder[Any]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        if len(data) >= PIECEWISE_BYTES and (pieces := decode_in_pieces(decoder, data)) is not None:
            return pieces  # the same value, the GIL given back between pieces (`pubsub_filter.core.compare.piecewise`)
        try:
            return decoder.decode(data)
        except DECODE_ERRORS:
            return NOT_JSON

    return decode


def _rows(route: Route, payload: Any) -> list[Any]:
    """The list of records the route hashes: at `rows`, or the payload as one record."""
    if route.rows is None:
        return payload if isinstance(payload, list) else [payload]
    rows = route.rows.resolve(payload, {})
    if rows is MISSING:
        raise MissingField(str(route.rows), f"{route.rows} is missing from the payload")
    if not isinstance(rows, list):
        raise MissingField(str(route.rows), f"{route.rows} is {json_kind(rows)}, not a list of rows")
    return rows


def selector(route: Route) -> Callable[[Any], Any]:
    """A row's counted fields (include minus exclude), as the fingerprint selects them; a row
    that is not an object, as it is."""
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


def _canonical(route: Route) -> Callable[[Any], str]:
    select = selector(route)
    row_key = tuple(route.row_key)
    ordered = ordered_rows(
        itemgetter(*row_key) if row_key else None, lambda r: [_get(r, k) for k in row_key], encode_sorted
    )

    if route.rows is None:

        def digest(payload: Any) -> str:
            if isinstance(payload, list):
                return hex_fingerprint(ordered([select(r) for r in payload]))
            return hex_fingerprint(encode_sorted(select(payload)))

        return digest

    def digest_rows(payload: Any) -> str:
        return hex_fingerprint(ordered([select(r) for r in _rows(route, payload)]))

    return digest_rows


def _by_value(route: Route) -> Callable[[Any], str | None]:
    """The canonical fingerprint of a payload that holds a number beyond double range (read by
    `wide_decoder`) when no such number is in the content the route counts: the number is in a
    field the route leaves out, so the fingerprint is by value, as if it were not there (the
    typed fast path never reads such a field either). None when one is counted: canonical text
    has no spelling for it, and the payload is fingerprinted over its bytes."""
    select, digest = selector(route), _canonical(route)

    def by_value(payload: Any) -> str | None:
        if route.rows is None:
            counted = [select(r) for r in payload] if isinstance(payload, list) else select(payload)
        else:
            counted = [select(r) for r in _rows(route, payload)]
        return None if _holds_wide(counted) else digest(payload)

    return by_value


def _holds_wide(value: Any) -> bool:
    """Whether a number beyond double range (a Decimal, `canonical.wide_number`) is in `value`.
    A loop, not a recursion: JSON may nest deeper than Python's stack goes."""
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            stack.extend(v.values())
        elif t is list:
            stack.extend(v)
        elif t is Decimal:
            return True
    return False


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
        return hex_fingerprint("\n".join(lines).encode("utf-8"))

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
        return hex_fingerprint(json.dumps(signatures).encode())

    return digest


def compile_scheme(route: Route) -> Scheme:
    """Build the route's payload fingerprint once; call it per message."""
    if route.scheme == "canonical":
        typed = typed_canonical(route)
        fast, selected = typed if typed is not None else (None, None)
        return Scheme(
            "canonical",
            _decoder(canonical_decoder),
            _canonical(route),
            fast,
            selected,
            _decoder(wide_decoder),
            _by_value(route),
        )
    if route.scheme == "data_hash":
        return Scheme("data_hash", _decoder(plain_decoder), _data_hash(route))
    return Scheme("event", _decoder(plain_decoder), _event(route))
