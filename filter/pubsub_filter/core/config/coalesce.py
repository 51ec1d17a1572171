"""A route's `coalesce` key: hold a burst of one key's messages and decide only its newest
(`pubsub_filter.core.engine.coalesce`), and the rules that keep a held message inside its ack deadline.

    coalesce: {quiet: 500ms, max_wait: 2s}

`quiet`: a key with no message for this long ends its burst. `max_wait`: a burst still going
this long after its first message ends all the same (a key that never goes quiet still forwards,
once per `max_wait`).
"""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from pubsub_filter.core.config.sections import Duration, LeaseConfig, StoreErrors, Strict
from pubsub_filter.core.times import parse_duration

Problem = tuple[tuple[Any, ...], str]

#: What the Pub/Sub publisher's `timeout` defaults to (`config_sections.PubsubPublisher`).
_PUBSUB_PUBLISH_TIMEOUT = 30.0


class Coalesce(Strict):
    """How long a key's burst may be held before its newest message is decided."""

    quiet: Duration
    max_wait: Duration

    @model_validator(mode="after")
    def _quiet_within_max_wait(self) -> Coalesce:
        if self.quiet > self.max_wait:
            raise ValueError(
                f"quiet ({self.quiet:g}s) is longer than max_wait ({self.max_wait:g}s): a burst always ends "
                "at max_wait, so quiet would never apply; make quiet at most max_wait"
            )
        return self


def _seconds(mapping: Any, key: str, default: float | None) -> float | None:
    if not isinstance(mapping, dict) or key not in mapping or mapping[key] is None:
        return default
    try:
        return parse_duration(mapping[key])
    except ValueError:
        return None  # its field error says why


def coalesce_rules(raw: dict[str, Any]) -> list[Problem]:
    """A held message must still be decided and answered inside the subscription's ack deadline
    (`lease.ack_deadline`, which `infra/` and `provision` set on it): after `max_wait` come the
    store's budget and the publish's. Past the deadline Pub/Sub redelivers what is held (push:
    the held request's answer no longer counts), so every burst would be decided twice."""
    routes = raw.get("routes")
    if not isinstance(routes, list):
        return []
    ack = _seconds(raw.get("lease"), "ack_deadline", LeaseConfig().ack_deadline)
    budget = _seconds(raw.get("store_errors"), "budget", StoreErrors().budget)
    publisher = raw.get("publisher")
    publish = 0.0
    if isinstance(publisher, dict) and publisher.get("backend") == "pubsub":
        publish = _seconds(publisher, "timeout", _PUBSUB_PUBLISH_TIMEOUT) or 0.0
    found: list[Problem] = []
    for i, route in enumerate(routes):
        coalesce = route.get("coalesce") if isinstance(route, dict) else None
        max_wait = _seconds(coalesce, "max_wait", None)
        if max_wait is None or ack is None or budget is None:
            continue
        needed = max_wait + budget + publish
        if needed >= ack:
            spent = f"max_wait {max_wait:g}s + store_errors.budget {budget:g}s"
            if publish:
                spent += f" + publisher.timeout {publish:g}s"
            found.append(
                (
                    ("routes", i, "coalesce", "max_wait"),
                    f"{spent} = {needed:g}s leaves no margin inside lease.ack_deadline ({ack:g}s): a held "
                    "message must be decided and answered before Pub/Sub redelivers it; lower max_wait "
                    f"below {max(ack - budget - publish, 0):g}s or raise lease.ack_deadline",
                )
            )
    return found


def held_note(route_name: str, coalesce: Coalesce) -> str:
    """What `check` says of a coalesced route: what its held push requests take from Cloud Run."""
    return (
        f"route {route_name!r}: coalesce holds the newest push request of each hot key open for up to "
        f"{coalesce.max_wait:g}s (quiet {coalesce.quiet:g}s): each takes one of the instance's Cloud Run "
        "`concurrency` slots while held; size concurrency for the requests decided at once plus the hot keys "
        "held at once (docs/deploying.md, 'Held requests'). Messages with an ordering key are never held."
    )
