"""The client library's side of a pull: its flow control, as the engine's leases want it, and
its messages, as the engine takes them."""

from __future__ import annotations

from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1

from filter.backends.gcp import timestamp
from filter.core.config import LeaseConfig, PullConfig
from filter.core.envelope import effective_publish_time
from filter.core.model import Message

#: Pub/Sub's bounds on an ack deadline, in seconds.
MIN_ACK_DEADLINE, MAX_ACK_DEADLINE = 10, 600


def flow_control(pull: PullConfig, lease: LeaseConfig) -> Any:
    """The subscriber's flow control: `pull:` from the config, leases extended as the engine's live."""
    # An int: the client copies it into StreamingPullRequest.stream_ack_deadline_seconds.
    extension = int(min(max(round(lease.ack_deadline), MIN_ACK_DEADLINE), MAX_ACK_DEADLINE))
    return pubsub_v1.types.FlowControl(
        max_messages=pull.max_messages,
        max_bytes=pull.max_bytes,
        max_lease_duration=float(pull.max_lease_duration or lease.duration),
        min_duration_per_lease_extension=extension,
        max_duration_per_lease_extension=extension,
    )


def to_message(received: Any, subscription: str | None = None) -> Message:
    """A google-cloud-pubsub subscriber message → `filter.core.model.Message`."""
    attributes = dict(received.attributes)
    return Message(
        data=bytes(received.data),
        attributes=attributes,
        message_id=str(received.message_id),
        publish_time=effective_publish_time(attributes, timestamp(received.publish_time)),
        ordering_key=received.ordering_key or None,
        delivery_attempt=received.delivery_attempt,
        subscription=subscription,
    )
