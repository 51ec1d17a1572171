"""A message whose key cannot be read (`MissingField`), and the route's `on_missing_key` for it.

With no key there is no state to decide on: nothing is read or written for the message, no
lease is taken. Under `on_missing_key: forward` (the default) it is forwarded as it came,
recorded `fail_open`, as a message is when the store cannot answer: a producer that renames a
key field must not stop every downstream phase. Its redelivery is forwarded again (nothing
recorded it); the forward carries the filter's attributes, so a consumer can drop a second
copy by `filter_source_message_id`. Under `reject`, `MissingField` is raised again: the message
is rejected (400), the unreadable path its reason.
"""

from __future__ import annotations

import msgspec

from pubsub_filter.core.compare.canonical import MissingField, PayloadError
from pubsub_filter.core.compare.fingerprint import NOT_JSON, raw_fingerprint
from pubsub_filter.core.compare.routes import RouteRules


class Keyless(msgspec.Struct, frozen=True):
    """What a forward of a message without its key carries, and what its record says."""

    missing: str  # the path that could not be read: a key field, or the rows
    reason: str
    fingerprint: str
    raw: bool  # the fingerprint is over the raw bytes (not JSON, or rows that cannot be read)


def keyless(rules: RouteRules, data: bytes, missing: MissingField) -> Keyless:
    """The forward of a message whose key cannot be read; raises `missing` again when the route
    says `on_missing_key: reject`."""
    if rules.route.on_missing_key == "reject":
        raise missing
    try:
        payload, fp = rules.scheme(data)
        raw = payload is NOT_JSON
    except PayloadError:  # the rows cannot be read, so neither can the content: its bytes, then
        fp, raw = raw_fingerprint(data), True
    reason = f"{missing}: forwarded without a dedup decision (on_missing_key: forward)"
    return Keyless(missing.path, reason, fp, raw)
