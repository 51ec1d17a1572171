"""Pub/Sub's limits on a message, and the two sizes the filter derives from them: the largest push
body Pub/Sub can send (`LARGEST_PUSH`, what `server.max_body` must take) and the size of the
Publish request a forward makes (`publish_request_bytes`, which must stay within
`PUBLISH_REQUEST_LIMIT`).

The emulator enforces none of these (it takes 101 attributes, a 1,025-byte value and 10 MiB
of data alike); Pub/Sub does, and the client library refuses a Publish request over
`PUBLISH_REQUEST_LIMIT` before sending it.
"""

from __future__ import annotations

from collections.abc import Mapping

#: A message's data, and a whole Publish request (topic, data, attributes, ordering key): 10 MB,
#: as the client library counts it (`_SERVER_PUBLISH_MAX_BYTES`).
MAX_DATA = 10_000_000
PUBLISH_REQUEST_LIMIT = 10_000_000
#: Attributes on one message, and the bytes of a name and of a value.
MAX_ATTRIBUTES = 100
MAX_NAME_BYTES = 256
MAX_VALUE_BYTES = 1024
MAX_ORDERING_KEY_BYTES = 1024
#: `projects/<project id, 6-30 characters>/subscriptions/<id, 3-255>`.
MAX_PROJECT_ID = 30
MAX_SUBSCRIPTION_PATH = len("projects/") + MAX_PROJECT_ID + len("/subscriptions/") + 255
#: A message id, a publish time (RFC 3339) and a delivery attempt as the envelope spells them:
#: far shorter than this in practice.
_MAX_SHORT_FIELD = 64
#: Braces, field names, colons and commas of the envelope (about 170 bytes with every field
#: present in both spellings).
_FRAME = 256

MiB = 1024 * 1024
#: Cloud Run's limit on an HTTP/1 request.
CLOUD_RUN_HTTP1_REQUEST = 32 * MiB


def _json_string(max_bytes: int) -> int:
    """The most JSON text a string of `max_bytes` UTF-8 bytes can take: quoted, every byte a
    control character written `\\u00XX` (6 bytes; a 4-byte character as a surrogate pair is 12)."""
    return 2 + 6 * max_bytes


def _json_base64(max_bytes: int) -> int:
    """The most JSON text the base64 of `max_bytes` bytes can take: 4 characters per 3 bytes,
    each `/` escaped as `\\/` (the emulator does; data of 0xFF bytes is all `/`), the two `=`
    of padding possibly as `\\u003d`."""
    chars = 4 * -(-max_bytes // 3)
    return 2 + 2 * chars + 2 * 4


def _largest_push() -> int:
    attributes = MAX_ATTRIBUTES * (_json_string(MAX_NAME_BYTES) + 1 + _json_string(MAX_VALUE_BYTES) + 1)
    both_spellings = 2 * (  # messageId/message_id, publishTime/publish_time, orderingKey/ordering_key
        _json_string(_MAX_SHORT_FIELD) + _json_string(_MAX_SHORT_FIELD) + _json_string(MAX_ORDERING_KEY_BYTES)
    )
    return (
        _json_base64(MAX_DATA)
        + attributes
        + both_spellings
        + _json_string(MAX_SUBSCRIPTION_PATH)
        + _MAX_SHORT_FIELD  # deliveryAttempt
        + _FRAME
    )


#: The largest wrapped push body a valid message can make: 27,451,294 bytes (26.2 MiB), of which
#: 26,666,682 are the data (10 MB, base64, every `/` escaped) and 768,600 the 100 attributes
#: (every byte escaped six-fold). Plain data of that size with plain attributes pushes about 13.5 MB.
LARGEST_PUSH = _largest_push()
#: `server.max_body`'s default: `LARGEST_PUSH` rounded up to a whole MiB (27 MiB), which leaves
#: Cloud Run's 32 MiB room for the request line and headers.
DEFAULT_MAX_BODY = -(-LARGEST_PUSH // MiB) * MiB


def _varint(n: int) -> int:
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def _field(length: int) -> int:
    """A length-delimited protobuf field with a one-byte tag (field number under 16)."""
    return 1 + _varint(length) + length


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def publish_request_bytes(topic: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None) -> int:
    """The bytes of a Publish request carrying this one message, as the client library and
    Pub/Sub count them (`PublishRequest(topic, messages=[PubsubMessage(...)]).ByteSize()`)."""
    message = _field(len(data)) if data else 0
    for name, value in attributes.items():
        entry = _field(_utf8(name)) + _field(_utf8(value))  # a map entry writes both, even empty
        message += _field(entry)
    if ordering_key:
        message += _field(_utf8(ordering_key))
    return (_field(_utf8(topic)) if topic else 0) + _field(message)
