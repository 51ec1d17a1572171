"""What a surface may know of the engine it calls (`Engine.facts`): fixed when the engine is
built, one immutable value, so that no surface reads the engine's config or its rules.

Each fact is here because a surface needs it to do its own job, not the engine's: the push
endpoint's limits on bodies and which routes exist and how their subscriptions push, the pull
worker's flow control and leases, the in-process API's default for keeping a body's result,
and the instance name every surface's `serving`/`pulling`/`stopped` lines carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from pubsub_filter.core.config.schema import Config, PullConfig

PushFormat = Literal["wrapped", "unwrapped", "unwrapped_no_metadata"]


@dataclass(frozen=True, slots=True)
class RouteFacts:
    """What a surface may know of one route."""

    #: How the route's push subscription sends a message (`Route.push_format`).
    push_format: PushFormat
    #: Whether the in-process API keeps a body's result by default (`Route.cache_result`).
    cache_result: bool


@dataclass(frozen=True, slots=True)
class Facts:
    """The read-only facts of one engine a surface needs (`Engine.facts`)."""

    #: This engine's name in its leases and in the surfaces' lines (`serving`, `pulling`, `stopped`).
    instance: str
    #: Every route the config defines, by name; any other is unknown (read-only).
    routes: Mapping[str, RouteFacts]
    #: `server.max_body`: the largest push body read, in bytes.
    max_body: int
    #: `server.max_bytes_in_flight`: push bodies taken in at once, in bytes.
    max_bytes_in_flight: int
    #: `server.admission_wait`: how long a push past `max_bytes_in_flight` waits for room, in seconds.
    admission_wait: float
    #: `server.body_timeout`: the sender's time to send a push body, in seconds.
    body_timeout: float
    #: `server.shutdown_budget`: the whole stop, SIGTERM to exit, in seconds.
    shutdown_budget: float
    #: `lease.ack_deadline`: a pulled message's ack deadline is extended by this at a time.
    ack_deadline: float
    #: `lease.duration`: how long a claim on a key lives (the pull's longest lease by default).
    lease_duration: float
    #: `pull:`, the pull worker's flow control and health port.
    pull: PullConfig

    @classmethod
    def of(cls, config: Config, instance: str) -> Facts:
        routes = {r.name: RouteFacts(r.push_format, r.cache_result) for r in config.routes}
        server, lease = config.server, config.lease
        return cls(
            instance=instance,
            routes=MappingProxyType(routes),
            max_body=server.max_body,
            max_bytes_in_flight=server.max_bytes_in_flight,
            admission_wait=server.admission_wait,
            body_timeout=server.body_timeout,
            shutdown_budget=server.shutdown_budget,
            ack_deadline=lease.ack_deadline,
            lease_duration=lease.duration,
            pull=config.pull,
        )
