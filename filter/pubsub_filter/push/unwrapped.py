"""Pushes with payload unwrapping → `Message`: the data is the body, the rest is in headers.

A subscription with payload unwrapping (`--push-no-wrapper`) posts the message's data as the
request body. With write metadata (`--push-no-wrapper-write-metadata`) it adds the message id,
publish time, subscription and ordering key as `x-goog-pubsub-*` headers, and every attribute
as a header of its own name; without it, the body is all there is: no id, no attributes.

Which form a push is, is decided on the headers and the route, never on the body (a producer
writes the body: a payload shaped like an envelope must stay a payload):

- an `x-goog-pubsub-message-id` header: unwrapped with metadata (Pub/Sub sends none with a
  wrapped push, and a producer cannot add a header to one);
- none, on a route with `push_format: unwrapped_no_metadata`: unwrapped without metadata;
- none, on any other route: Pub/Sub's envelope (`pubsub_filter.core.envelope`).

The HTTP layer lower-cases header names, so attribute names arrive lower-cased, and header
values arrive without leading or trailing white space. Headers that Pub/Sub, Google's front
end or an HTTP hop set are never attributes (`is_attribute`). docs/deploying.md says what
that means for a route ("Payload unwrapping").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from pubsub_filter.core.envelope import EnvelopeError, effective_publish_time, parse_envelope
from pubsub_filter.core.model import Message
from pubsub_filter.core.times import parse_time

#: The header that makes a push an unwrapped one with metadata.
MESSAGE_ID = b"x-goog-pubsub-message-id"
_PUBLISH_TIME = b"x-goog-pubsub-publish-time"
_SUBSCRIPTION = b"x-goog-pubsub-subscription-name"
_ORDERING_KEY = b"x-goog-pubsub-ordering-key"
_METADATA = frozenset((MESSAGE_ID, _PUBLISH_TIME, _SUBSCRIPTION, _ORDERING_KEY))
_PUBSUB_PREFIX = b"x-goog-pubsub-"

#: Header names that are never an attribute: hop-by-hop headers (RFC 9110 7.6.1), the request's
#: own (its host, credentials, client and what it accepts), and what Google's front end and
#: Cloud Run add on the way (tracing, forwarding).
NOT_ATTRIBUTES = frozenset(
    (
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"authorization",
        b"user-agent",
        b"from",
        b"accept",
        b"accept-charset",
        b"accept-encoding",
        b"accept-language",
        b"expect",
        b"via",
        b"forwarded",
        b"x-real-ip",
        b"traceparent",
        b"tracestate",
        b"x-cloud-trace-context",
    )
)
#: Header name prefixes that are never an attribute: the body's description (`content-type`,
#: `content-length`, `content-encoding`...), Google's and App Engine's own, and forwarding.
NOT_ATTRIBUTE_PREFIXES = (b"content-", b"x-goog-", b"x-google-", b"x-appengine-", b"x-forwarded-", b"x-envoy-")

#: How a message id made from the data starts (a push without metadata has none of its own).
DATA_ID_PREFIX = "data-sha256:"


def is_attribute(name: bytes) -> bool:
    """Whether a (lower-case) header of an unwrapped push with metadata carries an attribute."""
    return name not in NOT_ATTRIBUTES and not name.startswith(NOT_ATTRIBUTE_PREFIXES)


def data_id(data: bytes) -> str:
    """The message id of a push without metadata: its data's digest, the same on every
    redelivery, so a redelivery of a message in flight is held back (503) rather than acked
    while the first delivery may still fail (`pubsub_filter.core.engine.judge`)."""
    return DATA_ID_PREFIX + hashlib.sha256(data).hexdigest()[:32]


def parse_without_metadata(body: bytes) -> Message:
    """A push without metadata: the body is the data, there are no attributes, no id of its own."""
    return Message(data=body, attributes={}, message_id=data_id(body), has_id=False)


def _text(name: bytes, value: bytes, message_id: str | None) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise EnvelopeError(f"header {_name(name)} is not UTF-8 text", message_id) from None


def _name(name: bytes) -> str:
    return name.decode("latin-1")[:100]


def parse_with_metadata(body: bytes, headers: Iterable[tuple[bytes, bytes]]) -> Message:
    """A push with metadata: the id and the rest of the metadata from `x-goog-pubsub-*`, each
    header that `is_attribute` as an attribute. `EnvelopeError` for what Pub/Sub never sends:
    a metadata header twice (an attribute named like one), an attribute header twice (two
    attribute names that differ only in case), a header value that is not UTF-8."""
    metadata: dict[bytes, bytes] = {}
    raw: dict[bytes, bytes] = {}
    twice: list[bytes] = []
    for name, value in headers:
        if name in _METADATA:
            if name in metadata:
                twice.append(name)
            metadata.setdefault(name, value)
        elif is_attribute(name):
            if name in raw:
                twice.append(name)
            raw[name] = value
    mid = metadata.get(MESSAGE_ID, b"").decode("latin-1").strip()
    message_id = mid if mid.isascii() and mid.isprintable() and 0 < len(mid) <= 256 else None
    if message_id is None:
        raise EnvelopeError(f"header {MESSAGE_ID.decode()} is not a message id")
    if twice:
        names = ", ".join(sorted({_name(n) for n in twice}))
        raise EnvelopeError(
            f"header {names} sent more than once: attribute names that differ only in case, or named like "
            "Pub/Sub's metadata, cannot be told apart in an unwrapped push",
            message_id,
        )
    attributes = {name.decode("latin-1"): _text(name, value, message_id) for name, value in raw.items()}
    publish_time = None
    if stamp := metadata.get(_PUBLISH_TIME):
        try:
            publish_time = parse_time(_text(_PUBLISH_TIME, stamp, message_id))
        except ValueError as exc:
            raise EnvelopeError(f"header {_PUBLISH_TIME.decode()}: {exc}", message_id) from None
    subscription = metadata.get(_SUBSCRIPTION)
    ordering_key = metadata.get(_ORDERING_KEY)
    return Message(
        data=body,
        attributes=attributes,
        message_id=message_id,
        publish_time=effective_publish_time(attributes, publish_time),
        ordering_key=_text(_ORDERING_KEY, ordering_key, message_id) or None if ordering_key else None,
        subscription=_text(_SUBSCRIPTION, subscription, message_id) or None if subscription else None,
    )


def parse_push(body: bytes | bytearray, headers: Iterable[tuple[bytes, bytes]], metadata: bool, bare: bool) -> Message:
    """The message of one push, in whichever form it came: `metadata` when the push carries an
    `x-goog-pubsub-message-id` header, `bare` when its route's subscription sends the data
    without metadata (`push_format: unwrapped_no_metadata`); else Pub/Sub's envelope. A body read
    in parts comes as the `bytearray` it was gathered in: an envelope is decoded from it as it
    is, a body that is the data is made `bytes` (a message's values do not change)."""
    if metadata:
        return parse_with_metadata(bytes(body), headers)
    if bare:
        return parse_without_metadata(bytes(body))
    return parse_envelope(body)
