"""Which dead letters a run takes: `--where` conditions and `--since`/`--until`.

`--where` is the config's condition language (`pubsub_filter.core.compare.conditions`): the same text
decides the same way as a route's bypass rule would. `--since`/`--until` compare the
message's original publish time, not when it was dead-lettered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pubsub_filter.core.compare.conditions import holds
from pubsub_filter.core.compare.fingerprint import NOT_JSON
from pubsub_filter.core.config.schema import Condition
from pubsub_filter.replay.deadletter import DeadLetter


@dataclass(frozen=True, slots=True)
class Where:
    text: str  # as the operator wrote it, to say why a message was left out
    condition: Condition


@dataclass(frozen=True, slots=True)
class Selection:
    where: tuple[Where, ...] = ()
    since: float | None = None
    until: float | None = None

    def excluded(self, item: DeadLetter) -> str | None:
        """The option that leaves `item` out of this run, or None when it is taken."""
        if self.since is not None or self.until is not None:
            t = item.original_time
            if self.since is not None and t < self.since:
                return "--since"
            if self.until is not None and t >= self.until:
                return "--until"
        if self.where:
            try:
                payload: Any = json.loads(item.data)
            except (ValueError, RecursionError):  # not JSON, or nested past the decoder: raw bytes
                payload = NOT_JSON
            for w in self.where:
                if not holds(w.condition, payload, item.attributes):
                    return f"--where {w.text}"
        return None
