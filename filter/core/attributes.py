"""The attributes the filter writes on what it forwards: their names, and what a forward carries.

Consumers read these (the source hash, the fence and key for `filter.core.fence`), so the
names are part of the contract; a producer's own values for them are dropped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from filter.core.model import Message
from filter.core.times import format_time

ATTR_FINGERPRINT = "filter_fingerprint"
ATTR_SOURCE_ID = "filter_source_message_id"
ATTR_ROUTE = "filter_route"
ATTR_SOURCE_PUBLISH_TIME = "filter_source_publish_time"
ATTR_FENCE = "filter_fence"
ATTR_KEY = "filter_key"
ATTR_KEY_SHA256 = "filter_key_sha256"
#: Pub/Sub caps an attribute value at 1,024 bytes.
ATTRIBUTE_LIMIT = 1024
#: Attributes only the filter writes on what it forwards. A producer's own values for them are
#: dropped, so a consumer can trust them (`filter_rows_changed: 0` on a whole payload, say).
OWN_ATTRIBUTES = frozenset(
    {
        ATTR_FINGERPRINT,
        ATTR_SOURCE_ID,
        ATTR_ROUTE,
        ATTR_SOURCE_PUBLISH_TIME,
        ATTR_FENCE,
        ATTR_KEY,
        ATTR_KEY_SHA256,
        "filter_rows_total",
        "filter_rows_changed",
        "filter_rows_removed",
        "filter_rows_removed_keys",
        "filter_rows_removed_truncated",
    }
)


def fence_attributes(key: str, fence: int) -> dict[str, str]:
    """What a fenced forward carries so a consumer can drop an older holder's late copy (`filter.core.fence`).

    A key longer than an attribute value may be (1,024 bytes) goes as its SHA-256 under its own
    name, so no short key can be mistaken for a long key's digest.
    """
    attributes = {ATTR_FENCE: str(fence)}
    if len(key.encode()) <= ATTRIBUTE_LIMIT:
        attributes[ATTR_KEY] = key
    else:
        attributes[ATTR_KEY_SHA256] = hashlib.sha256(key.encode()).hexdigest()
    return attributes


def forward_attributes(route: str, msg: Message, fingerprint: str, own: Mapping[str, str]) -> dict[str, str]:
    """The producer's attributes less the filter's own names, then the filter's: `own` (rows, fence),
    the fingerprint, the source message and route."""
    attributes = {k: v for k, v in msg.attributes.items() if k not in OWN_ATTRIBUTES}
    attributes.update(own)
    attributes[ATTR_FINGERPRINT] = fingerprint
    attributes[ATTR_SOURCE_ID] = msg.message_id
    attributes[ATTR_ROUTE] = route
    if msg.publish_time is not None:
        attributes[ATTR_SOURCE_PUBLISH_TIME] = format_time(msg.publish_time)
    return attributes
