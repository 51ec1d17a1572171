"""Row mode `changed`: the payload cut down to its new and changed rows, and the attributes that say so.

Rows are chosen by their key as the row digests read it (canonical numbers: a key spelled
`1.0` is the row `[1]`) and sent as the producer spelled them. Only a forward whose content
changed gets here; a suppression never pays for it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pubsub_filter.core.attributes import ATTRIBUTE_LIMIT
from pubsub_filter.core.compare import rows
from pubsub_filter.core.compare.canonical import plain_decode, plain_encode
from pubsub_filter.core.compare.fingerprint import NOT_JSON, TypedRows
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.paths import list_index


def partial(
    rules: RouteRules,
    data: bytes,
    diff: rows.RowDiff,
    typed: TypedRows | None = None,
    keys: list[str] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The payload with only new and changed rows (plus tombstones when asked), and attributes saying so.

    `keys`: the row key of each of `typed`'s rows, in order, when the digests already read them.
    """
    route = rules.route
    assert route.rows is not None
    wanted = set(diff.added) | set(diff.changed)
    row_key = tuple(route.row_key)
    payload, parent, leaf, kept = _kept_raw(rules, data, wanted, typed, keys) or _kept(rules, data, wanted, row_key)
    attributes = {
        "filter_rows_total": str(diff.total),
        "filter_rows_changed": str(len(wanted)),
        "filter_rows_removed": str(len(diff.removed)),
    }
    if route.removed_rows == "tombstone":
        kept += [{**dict(zip(row_key, plain_decode(k), strict=False)), "filter_removed": True} for k in diff.removed]
    elif route.removed_rows == "attribute" and diff.removed:
        listed = msgspec.json.encode(diff.removed).decode()
        if len(listed.encode()) > ATTRIBUTE_LIMIT:
            attributes["filter_rows_removed_truncated"] = "true"
            listed = listed.encode()[:ATTRIBUTE_LIMIT].decode("utf-8", "ignore")
        attributes["filter_rows_removed_keys"] = listed
    if leaf:
        parent[leaf] = kept
    else:
        payload = kept
    return plain_encode(payload), attributes


def _kept(
    rules: RouteRules, data: bytes, wanted: set[str], keys: tuple[str, ...]
) -> tuple[Any, Any, str | None, list[Any]]:
    """The rows to send, chosen by their keys as the digests read them, sent as the producer
    spelled them (plain decode)."""
    assert rules.route.rows is not None
    payload = plain_decode(data)
    canonical = rules.scheme.decode(data)
    if canonical is NOT_JSON:
        canonical = rules.scheme.readable(data)  # a number beyond double range, as the row digests read it
    parent, leaf = _parent(payload, rules.route.rows.parts)
    found = parent[leaf] if leaf else payload
    as_read = rules.route.rows.resolve(canonical, {})  # the same list, row for row
    if not isinstance(as_read, list) or len(as_read) != len(found):
        as_read = found  # not canonical JSON (a number it refuses): key by the plain reading
    kept = [
        r for r, c in zip(found, as_read, strict=True) if isinstance(r, dict) and rows.row_key_of(c, keys) in wanted
    ]
    return payload, parent, leaf, kept


def _kept_raw(
    rules: RouteRules, data: bytes, wanted: set[str], typed: TypedRows | None, keys: list[str] | None
) -> tuple[Any, Any, str | None, list[Any]] | None:
    """`_kept` without decoding the rows that are not sent: rows stay raw JSON until chosen
    by the keys of the rows the fingerprint's fast path decoded (same rows, same order);
    the chosen ones and the other top-level fields are decoded as `_kept` decodes them."""
    assert rules.route.rows is not None
    typed = typed or rules.typed_rows(data)
    if typed is None or len(rules.route.rows.parts) != 1:
        return None
    leaf = rules.route.rows.parts[0]
    try:
        top = _top(data)
    except (msgspec.DecodeError, msgspec.ValidationError):  # a number beyond double range: `_kept` reads it
        return None
    found = top.get(leaf)
    if not isinstance(found, list) or len(found) != len(typed.rows):
        return None
    # document order; the rows' place is filled by the caller
    payload = {k: None if k == leaf else _plain(v) for k, v in top.items()}
    if keys is None or len(keys) != len(found):
        keys = [typed.key_json(row).decode() for row in typed.rows]
    kept = [plain_decode(raw) for raw, key in zip(found, keys, strict=True) if key in wanted]
    return payload, payload, leaf, kept


# The top-level object in one pass: lists stay raw JSON element by element (the rows among
# them), everything else decodes as the plain decoder reads it (every JSON value is one of these).
_top = msgspec.json.Decoder(dict[str, list[msgspec.Raw] | dict[str, Any] | str | int | float | bool | None]).decode


def _plain(value: Any) -> Any:
    """A top-level value as `msgspec.json.decode` reads it: a list's raw elements decoded."""
    return [plain_decode(raw) for raw in value] if isinstance(value, list) else value


def _parent(payload: Any, parts: tuple[str, ...]) -> tuple[Any, str | None]:
    """The object holding the rows list, and the rows' field name in it (None: the payload is the list)."""
    if not parts:
        return payload, None
    node = payload
    for part in parts[:-1]:
        # `rows` resolved on this payload already, so every step through a list is an index
        index = list_index(part) if isinstance(node, list) else None
        node = node[part] if index is None else node[index]
    return node, parts[-1]
