"""The client library's side of a pull: its flow control, as the engine's leases want it.

Its messages become the engine's with `pubsub_filter.google.received.received_message`."""

from __future__ import annotations

from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1

from pubsub_filter.core.config.schema import PullConfig

#: Pub/Sub's bounds on an ack deadline, in seconds.
MIN_ACK_DEADLINE, MAX_ACK_DEADLINE = 10, 600


def flow_control(pull: PullConfig, ack_deadline: float, lease_duration: float) -> Any:
    """The subscriber's flow control: `pull:` from the config, leases extended as the engine's
    live (`lease.ack_deadline` at a time, for `lease.duration` unless `pull:` says otherwise)."""
    # An int: the client copies it into StreamingPullRequest.stream_ack_deadline_seconds.
    extension = int(min(max(round(ack_deadline), MIN_ACK_DEADLINE), MAX_ACK_DEADLINE))
    return pubsub_v1.types.FlowControl(
        max_messages=pull.max_messages,
        max_bytes=pull.max_bytes,
        max_lease_duration=float(pull.max_lease_duration or lease_duration),
        min_duration_per_lease_extension=extension,
        max_duration_per_lease_extension=extension,
    )
