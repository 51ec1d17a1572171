"""The attributes the filter writes on what it forwards: their names, and what a forward carries.

Consumers read these (the source hash, the fence and key for `pubsub_filter.consumer.fence`), so the
names are part of the contract; a producer's own values for them are dropped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from pubsub_filter.core.model import Message
from pubsub_filter.core.pubsub_limits import (
    MAX_ATTRIBUTES,
    MAX_NAME_BYTES,
    MAX_PROJECT_ID,
    MAX_VALUE_BYTES,
    PUBLISH_REQUEST_LIMIT,
    publish_request_bytes,
)
from pubsub_filter.core.times import format_time

#: The attribute a forward carries for each `changed_attributes` field that changed: this, then the name.
CHANGED_PREFIX = "filter_changed_"
ATTR_FINGERPRINT = "filter_fingerprint"
ATTR_SOURCE_ID = "filter_source_message_id"
ATTR_ROUTE = "filter_route"
ATTR_SOURCE_PUBLISH_TIME = "filter_source_publish_time"
ATTR_FENCE = "filter_fence"
ATTR_KEY = "filter_key"
ATTR_KEY_SHA256 = "filter_key_sha256"
#: Pub/Sub caps an attribute value at 1,024 bytes.
ATTRIBUTE_LIMIT = MAX_VALUE_BYTES
#: The trace context a traced forward carries (`pubsub_filter.observability.telemetry`), over a producer's own.
TRACE_ATTRIBUTE = "googclient_traceparent"
#: The bytes a traced publisher may add to a forward after the filter sized it: `googclient_traceparent`
#: (55 characters) and `googclient_tracestate` (at most 512), with their names and framing.
TRACE_CONTEXT_BYTES = 1024
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
    """What a fenced forward carries so a consumer can drop an older holder's late copy (`consumer.fence`).

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
    if any(k.startswith(CHANGED_PREFIX) for k in attributes):
        # the flags are the filter's (`changed_attributes`): a subscriber filters on them, so
        # a producer's own never pass
        attributes = {k: v for k, v in attributes.items() if not k.startswith(CHANGED_PREFIX)}
    attributes.update(own)
    attributes[ATTR_FINGERPRINT] = fingerprint
    attributes[ATTR_SOURCE_ID] = msg.message_id
    attributes[ATTR_ROUTE] = route
    if msg.publish_time is not None:
        attributes[ATTR_SOURCE_PUBLISH_TIME] = format_time(msg.publish_time)
    return attributes


def own_attribute_count(rows_changed: bool, flags: int) -> int:
    """The fingerprint, source message id, route, source publish time, fence, key (or its
    digest) and trace context; with `rows_mode: changed` the five `filter_rows_*` ones too; and
    `flags`, one per `changed_attributes` field."""
    return 7 + (5 if rows_changed else 0) + flags


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _shown(name: str) -> str:
    return name if len(name) <= 40 else name[:40] + "..."


def unforwardable(attributes: Mapping[str, str], own_at_most: int) -> str | None:
    """Why Pub/Sub would refuse a forward carrying the producer's `attributes` and up to
    `own_at_most` of the filter's; None when it would take it.

    Decided on the producer's attributes alone, before anything is claimed, so the answer is the
    same on every delivery: the message is rejected once (and dead-lettered by the
    subscription's policy) rather than failing its publish on every attempt. The filter's own
    names in the producer's attributes are replaced, not added, so they do not count.
    """
    kept = [
        name
        for name in attributes
        if name not in OWN_ATTRIBUTES and name != TRACE_ATTRIBUTE and not name.startswith(CHANGED_PREFIX)
    ]
    room = MAX_ATTRIBUTES - own_at_most
    if len(kept) > room:
        return (
            f"the message has {len(kept)} attributes; with the filter's own (up to {own_at_most} on this route) "
            f"its forward could carry more than Pub/Sub's {MAX_ATTRIBUTES}: at most {room} can be forwarded"
        )
    for name in kept:
        if (size := _bytes(name)) > MAX_NAME_BYTES:
            return f"attribute name {_shown(name)!r} is {size} bytes: Pub/Sub takes at most {MAX_NAME_BYTES}"
        if (size := _bytes(attributes[name])) > ATTRIBUTE_LIMIT:
            return f"attribute {_shown(name)!r} has a value of {size} bytes: Pub/Sub takes at most {ATTRIBUTE_LIMIT}"
    return None


def _topic_at_most(destination: str) -> str:
    """The destination as the Publish request names it: a topic id gets the longest project id
    (the project is the publisher's to resolve), so the size is never under the real one."""
    if destination.startswith("projects/"):
        return destination
    return "projects/" + "p" * MAX_PROJECT_ID + "/topics/" + destination


def unpublishable(destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None) -> str | None:
    """Why Pub/Sub would refuse this forward for its size (a Publish request over 10 MB, counted
    as the client library counts it, with room for the trace context); None when it would take it.

    Checked on the forward itself, just before it is sent: the data may be the changed rows
    only (or grow by tombstones), and the filter's attributes are known only then.
    """
    topic = _topic_at_most(destination)
    # Nearly every forward is far under: bound it first (a character is at most 4 bytes of UTF-8,
    # a length prefix at most 5), at a fifth of the exact count's cost.
    text = len(topic) + len(ordering_key or "") + sum(len(k) + len(v) for k, v in attributes.items())
    if len(data) + 4 * text + 18 * len(attributes) + 24 + TRACE_CONTEXT_BYTES <= PUBLISH_REQUEST_LIMIT:
        return None
    size = publish_request_bytes(topic, data, attributes, ordering_key) + TRACE_CONTEXT_BYTES
    if size <= PUBLISH_REQUEST_LIMIT:
        return None
    return (
        f"its forward would be a Publish request of {size} bytes ({len(data)} of data, {len(attributes)} "
        f"attributes with the filter's own, room for the trace context): Pub/Sub takes at most {PUBLISH_REQUEST_LIMIT}"
    )
