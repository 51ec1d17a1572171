"""One dead-lettered message as replay sees it: where it came from and what it is republished with.

The `CloudPubSubDeadLetter*` attributes describe one past dead-lettering, not the message:
they are dropped from what is republished, and what is worth keeping from them (the
original publish time, the dead-lettered id) is carried in `filter_replay_*` attributes
(see the package docstring).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pubsub_filter.core.envelope import ATTR_ORIGINAL_TIME
from pubsub_filter.core.errors import FilterError
from pubsub_filter.core.numerals import bounded_int
from pubsub_filter.core.pubsub_limits import MAX_ATTRIBUTES
from pubsub_filter.core.times import format_time, parse_time
from pubsub_filter.google.shared import pubsub_path, timestamp

ATTR_ORIGINAL_ID = "filter_replay_original_message_id"
ATTR_COUNT = "filter_replay_count"

DEAD_LETTER_PREFIX = "CloudPubSubDeadLetter"
DL_SUBSCRIPTION = "CloudPubSubDeadLetterSourceSubscription"
DL_PROJECT = "CloudPubSubDeadLetterSourceSubscriptionProject"
DL_PUBLISH_TIME = "CloudPubSubDeadLetterSourceTopicPublishTime"
DL_DELIVERY_COUNT = "CloudPubSubDeadLetterSourceDeliveryCount"


class ReplayFailure(FilterError):
    """This message cannot be replayed now; the reason is counted and it stays dead-lettered."""


def _parses(text: str | None) -> bool:
    if not text:
        return False
    try:
        parse_time(text)
    except ValueError:
        return False
    return True


@dataclass(slots=True)
class DeadLetter:
    ack_id: str
    message_id: str
    data: bytes
    attributes: dict[str, str]
    ordering_key: str
    publish_time: float  # when it was dead-lettered (its own publish time in the DLQ)
    publish_time_text: str

    @classmethod
    def from_received(cls, received: Any) -> DeadLetter:
        m = received.message
        stamp = m.publish_time
        text = stamp.rfc3339() if hasattr(stamp, "rfc3339") else format_time(timestamp(stamp) or 0.0)
        return cls(
            ack_id=received.ack_id,
            message_id=str(m.message_id),
            data=bytes(m.data),
            attributes=dict(m.attributes),
            ordering_key=m.ordering_key or "",
            publish_time=timestamp(stamp) or 0.0,
            publish_time_text=text,
        )

    @property
    def original_time_text(self) -> str:
        for name in (ATTR_ORIGINAL_TIME, DL_PUBLISH_TIME):
            text = self.attributes.get(name)
            if _parses(text):
                assert text is not None
                return text
        return self.publish_time_text

    @property
    def original_time(self) -> float:
        return parse_time(self.original_time_text)

    @property
    def original_id(self) -> str:
        return self.attributes.get(ATTR_ORIGINAL_ID) or self.message_id

    @property
    def delivery_count(self) -> str | None:
        return self.attributes.get(DL_DELIVERY_COUNT)

    def source_subscription(self) -> str | None:
        """The subscription that dead-lettered it, as a full path (None when the attributes do not say).

        The attributes can be set by whoever published the message: a malformed name fails
        this message (ReplayFailure), never the run.
        """
        sub = self.attributes.get(DL_SUBSCRIPTION)
        project = self.attributes.get(DL_PROJECT)
        if not sub or not (project or sub.startswith("projects/")):
            return None
        try:
            return pubsub_path(sub, "subscription", project or "")
        except ValueError as exc:
            raise ReplayFailure(f"{DL_SUBSCRIPTION}: {exc}") from None

    def replay_attributes(self) -> dict[str, str]:
        """The attributes to republish with (see the package docstring), at most Pub/Sub's 100.

        The message's own attributes are all kept; the replay's are added while there is room, the
        original publish time first (the stale guard needs it: without it an old message would
        pass as new), then the original id and the count (bookkeeping, left out when there is no
        room). With no room even for the publish time it cannot be replayed: `ReplayFailure`, and
        it stays in the dead-letter subscription."""
        out = {k: v for k, v in self.attributes.items() if not k.startswith(DEAD_LETTER_PREFIX)}
        previous = bounded_int(self.attributes.get(ATTR_COUNT, "0"), 18) or 0
        ours = {
            ATTR_ORIGINAL_TIME: self.original_time_text,
            ATTR_ORIGINAL_ID: self.original_id,
            ATTR_COUNT: str(previous + 1),
        }
        for name, value in ours.items():
            if name in out or len(out) < MAX_ATTRIBUTES:
                out[name] = value
            elif name == ATTR_ORIGINAL_TIME:
                raise ReplayFailure(
                    f"it has {len(out)} attributes of its own, Pub/Sub's limit, and a replay must add "
                    f"{ATTR_ORIGINAL_TIME}: left in the dead-letter subscription"
                )
        return out
