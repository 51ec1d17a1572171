"""Push bodies as large as Pub/Sub can make them: the envelope written as the emulator writes it
(both spellings of the id and publish time, every `/` escaped as `\\/`, control characters as
`\\u00XX`), with the data and attributes at Pub/Sub's limits."""

from __future__ import annotations

import base64
import json

from pubsub_filter.core.pubsub_limits import (
    MAX_ATTRIBUTES,
    MAX_DATA,
    MAX_NAME_BYTES,
    MAX_ORDERING_KEY_BYTES,
    MAX_VALUE_BYTES,
)

#: A subscription path of the longest project id and subscription id.
LONGEST_SUBSCRIPTION = "projects/" + "p" * 30 + "/subscriptions/" + "s" * 255
PUBLISH_TIME = "2026-01-01T00:00:00.123456789Z"


def escaped_envelope(
    data: bytes,
    attributes: dict[str, str],
    message_id: str = "12345678901234567",
    ordering_key: str = "",
    subscription: str = LONGEST_SUBSCRIPTION,
) -> bytes:
    """A wrapped push as the emulator writes it, at its most escaped."""
    message: dict[str, object] = {
        "publishTime": PUBLISH_TIME,
        "data": base64.b64encode(data).decode(),
        "publish_time": PUBLISH_TIME,
        "messageId": message_id,
        "attributes": attributes,
        "message_id": message_id,
    }
    if ordering_key:
        message["orderingKey"] = message["ordering_key"] = ordering_key
    text = json.dumps({"subscription": subscription, "message": message}, ensure_ascii=False, separators=(",", ":"))
    return text.replace("/", "\\/").encode()


def widest_attributes(count: int = MAX_ATTRIBUTES) -> dict[str, str]:
    """`count` attributes of the longest names and values, every byte a control character."""
    return {f"{i:03d}" + "\x01" * (MAX_NAME_BYTES - 3): "\x01" * MAX_VALUE_BYTES for i in range(count)}


def largest_push() -> bytes:
    """The largest body a valid message makes: 10 MB of 0xFF bytes (base64 all `/`), 100 of the
    widest attributes, the longest ordering key and subscription."""
    return escaped_envelope(b"\xff" * MAX_DATA, widest_attributes(), ordering_key="\x01" * MAX_ORDERING_KEY_BYTES)
