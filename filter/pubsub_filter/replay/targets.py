"""Where a dead letter goes: the topic it came from (or `--to`), or its route (`--through-filter`).

The source topic is that of the subscription that dead-lettered the message, looked up
once per subscription for the whole run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from google.api_core import exceptions as gexc

from pubsub_filter.core.config.schema import Config
from pubsub_filter.replay.deadletter import DL_PROJECT, DL_SUBSCRIPTION, DeadLetter, ReplayFailure
from pubsub_filter.replay.options import ReplayOptions


class Targets:
    def __init__(self, opts: ReplayOptions, subscriber: Any, config: Config | None):
        self.opts = opts
        self.subscriber = subscriber
        self.config = config
        self._topics: dict[str, asyncio.Future[str]] = {}

    def route_for(self, item: DeadLetter) -> str:
        """The route that decides `item` through the filter: `--route`, else the one whose subscription it left."""
        if self.opts.route:
            return self.opts.route
        source = item.source_subscription()
        if source is None:
            raise ReplayFailure(f"no {DL_SUBSCRIPTION} attribute to find its route: pass --route")
        routes = self.config.routes if self.config is not None else []
        for route in routes:
            sub = route.subscription
            if sub and (sub == source or ("/" not in sub and source.rsplit("/", 1)[-1] == sub)):
                return str(route.name)
        raise ReplayFailure(f"no route has subscription {source}: pass --route")

    async def describe(self, item: DeadLetter) -> str:
        if self.opts.through_filter:
            return f"route {self.route_for(item)!r} (through the filter)"
        return await self.topic(item)

    async def topic(self, item: DeadLetter) -> str:
        """The topic to republish `item` to."""
        if self.opts.to:
            return self.opts.to
        source = item.source_subscription()
        if source is None:
            raise ReplayFailure(f"no {DL_SUBSCRIPTION}/{DL_PROJECT} attributes to find its topic: pass --to TOPIC")
        lookup = self._topics.get(source)
        if lookup is None:
            lookup = asyncio.ensure_future(self._topic_of(source))
            self._topics[source] = lookup
        # Shielded: one message giving up (cancelled) must not cancel the lookup others share.
        return await asyncio.shield(lookup)

    async def _topic_of(self, subscription: str) -> str:
        try:
            sub = await asyncio.to_thread(self.subscriber.get_subscription, subscription=subscription, timeout=30)
        except gexc.NotFound:
            raise ReplayFailure(f"source subscription {subscription} no longer exists: pass --to TOPIC") from None
        except gexc.GoogleAPICallError as exc:
            raise ReplayFailure(f"cannot read source subscription {subscription}: {exc.message}") from None
        topic = str(sub.topic)
        if not topic or topic == "_deleted-topic_":
            raise ReplayFailure(f"the topic of {subscription} was deleted: pass --to TOPIC")
        return topic
