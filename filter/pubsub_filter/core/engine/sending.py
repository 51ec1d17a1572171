"""A forward's send: through the destination's publisher (`Publishing`), or the sender the
caller passes (`ports.Sender`), with the filter's attributes, within Pub/Sub's limits."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pubsub_filter.core.attributes import forward_attributes, unpublishable
from pubsub_filter.core.engine.handled import Delivery
from pubsub_filter.core.engine.judge import Outgoing
from pubsub_filter.core.model import Cause
from pubsub_filter.core.ports import Publisher, PublishFailed, Sender, Traced, Unpublishable, Worked


class Publishing:
    """The forward port over the destination's publisher."""

    cause = Cause.PUBLISH
    lands_despite_cancel = True  # Pub/Sub may deliver what it was handed, whatever we do
    attribute_limits = True

    def __init__(self, publisher: Publisher):
        self.publisher = publisher

    async def send(
        self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None, traced: Traced
    ) -> str:
        with traced.sending(destination, data, ordering_key):
            return await self.publisher.publish(destination, data, attributes, ordering_key)


async def send(
    d: Delivery, sender: Sender, out: Outgoing | None, every_flag: Callable[[str], Mapping[str, str]]
) -> str | Worked:
    """Send `out` (by default `d`'s message as it came) through `sender`: its id where it went
    (and a result to keep). `every_flag`: the route's `changed_attributes` flags, all set."""
    # Everything inside the try: any failure here must become PublishFailed, so the caller
    # releases the lease and the message is nacked, never left holding the key.
    try:
        # with no decision's outgoing (fail-open, shadow) what the destination holds is not
        # known: every `changed_attributes` field is flagged
        own = out.attributes if out is not None else every_flag(d.route.name)
        attributes = forward_attributes(d.route.name, d.msg, d.fp, own)
        data = out.data if out is not None else d.msg.data
        if sender.attribute_limits and (
            too_large := unpublishable(d.route.destination, data, attributes, d.msg.ordering_key)
        ):
            raise Unpublishable(too_large)  # the same on every delivery: rejected, never a failing publish
        return await sender.send(d.route.destination, data, attributes, d.msg.ordering_key, d.traced)
    except PublishFailed:
        raise
    except Exception as exc:  # a publisher bug must still nack, never lose the message
        raise PublishFailed(f"{type(exc).__name__}: {exc}") from exc
