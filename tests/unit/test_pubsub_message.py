"""A client's Pub/Sub message becomes the same `Message` whichever surface holds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from google.api_core.datetime_helpers import DatetimeWithNanoseconds
from google.cloud.pubsub_v1 import types
from google.protobuf.timestamp_pb2 import Timestamp

from pubsub_filter.core.envelope import ATTR_ORIGINAL_TIME
from pubsub_filter.core.errors import FilterTypeError
from pubsub_filter.google.received import epoch, received_message

SECONDS, NANOS = 1_780_000_000, 123_456_789


@dataclass
class _Received:
    """A subscriber message's fields (what the streaming pull hands the callback)."""

    data: bytes
    attributes: dict[str, Any]
    message_id: str
    publish_time: Any
    ordering_key: str = ""
    delivery_attempt: int | None = None


def test_a_datetime_with_nanoseconds_and_a_protobuf_timestamp_give_the_same_publish_time() -> None:
    stamp = DatetimeWithNanoseconds.from_timestamp_pb(Timestamp(seconds=SECONDS, nanos=NANOS))
    assert epoch(stamp) == epoch(Timestamp(seconds=SECONDS, nanos=NANOS)) == SECONDS + NANOS / 1e9
    assert epoch(Timestamp()) is None
    assert epoch(None) is None
    assert epoch(SECONDS) == float(SECONDS)
    with pytest.raises(FilterTypeError):
        epoch("yesterday")


def test_a_subscriber_message_and_a_pubsub_message_become_the_same_message() -> None:
    stamp = Timestamp(seconds=SECONDS, nanos=NANOS)
    built = types.PubsubMessage(data=b"x", attributes={"a": "1"}, message_id="m1", publish_time=stamp)
    received = _Received(
        b"x", {"a": "1"}, "m1", DatetimeWithNanoseconds.from_timestamp_pb(stamp), ordering_key="k", delivery_attempt=3
    )
    pulled = received_message(received, "projects/p/subscriptions/s")
    assert (pulled.data, dict(pulled.attributes), pulled.message_id, pulled.publish_time) == (
        b"x",
        {"a": "1"},
        "m1",
        SECONDS + NANOS / 1e9,
    )
    assert (pulled.ordering_key, pulled.delivery_attempt, pulled.subscription) == ("k", 3, "projects/p/subscriptions/s")
    made = received_message(built)
    assert (made.data, dict(made.attributes), made.message_id, made.publish_time) == (
        pulled.data,
        dict(pulled.attributes),
        pulled.message_id,
        pulled.publish_time,
    )
    assert (made.ordering_key, made.subscription) == (None, None)  # an empty ordering key is none


def test_given_attributes_replace_the_messages_own_and_set_the_effective_publish_time() -> None:
    received = _Received(b"x", {"CloudPubSubDeadLetterSourceDeliveryCount": "5", "n": 7}, "m1", float(SECONDS))
    kept = received_message(received, attributes={ATTR_ORIGINAL_TIME: "2026-01-01T00:00:00Z"})
    assert dict(kept.attributes) == {ATTR_ORIGINAL_TIME: "2026-01-01T00:00:00Z"}
    assert kept.publish_time == 1_767_225_600.0  # the original, older time decides staleness
    assert dict(received_message(received).attributes)["n"] == "7"  # attributes are text
