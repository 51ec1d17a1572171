"""pubsub-filter: forward a Pub/Sub message downstream only when its content changed.

The library's public surface is what `__all__` lists; everything else is internal and may move.

    from pubsub_filter import SyncFilter
    with SyncFilter("filter.yaml") as f:
        outcome = f.process("route", b'{"id": 1}', lambda forward: rebuild(forward.data))

    from pubsub_filter import Filter
    async with Filter("filter.yaml") as f:
        outcome = await f.process("route", payload, body, message_id="m1")

Every error the library raises derives from `FilterError`. The library does not configure
logging: its loggers are under `pubsub_filter` in the standard `logging` tree (silent until the
application configures logging, see `pubsub_filter.core.logs`); the `pubsub-filter` commands configure
it for themselves.
"""

from __future__ import annotations

import importlib

from pubsub_filter._version import __version__
from pubsub_filter.core.errors import FilterError, FilterTypeError, FilterUsageError, ResultNotStored, UnknownRouteError

# Not `typing.TYPE_CHECKING`: importing typing would triple the cost of `import pubsub_filter` (type
# checkers treat any name TYPE_CHECKING as true).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from pubsub_filter.consumer.fence import Admission, FenceContended, FenceError, Fences
    from pubsub_filter.consumer.stores.firestore import FirestoreFences
    from pubsub_filter.consumer.stores.sqlite import SqliteFences
    from pubsub_filter.core.config.schema import ConfigError
    from pubsub_filter.core.envelope import EnvelopeError
    from pubsub_filter.core.model import Decision, DecisionRecord, Message
    from pubsub_filter.core.ports import PublishFailed, StoreUnavailable
    from pubsub_filter.inprocess.api import Filter, FilterClosed, Forward, Outcome, SyncFilter
    from pubsub_filter.inprocess.handlers import Nack, on_cloudevent, on_payload, on_push
    from pubsub_filter.inprocess.messages import payload_message

#: name → the module that defines it, imported on first use: `import pubsub_filter` stays cheap.
_LAZY = {
    "Filter": "pubsub_filter.inprocess.api",
    "SyncFilter": "pubsub_filter.inprocess.api",
    "Outcome": "pubsub_filter.inprocess.api",
    "Forward": "pubsub_filter.inprocess.api",
    "FilterClosed": "pubsub_filter.inprocess.api",
    "on_payload": "pubsub_filter.inprocess.handlers",
    "on_push": "pubsub_filter.inprocess.handlers",
    "on_cloudevent": "pubsub_filter.inprocess.handlers",
    "Nack": "pubsub_filter.inprocess.handlers",
    "payload_message": "pubsub_filter.inprocess.messages",
    "Message": "pubsub_filter.core.model",
    "Decision": "pubsub_filter.core.model",
    "DecisionRecord": "pubsub_filter.core.model",
    "Fences": "pubsub_filter.consumer.fence",
    "Admission": "pubsub_filter.consumer.fence",
    "FenceError": "pubsub_filter.consumer.fence",
    "FenceContended": "pubsub_filter.consumer.fence",
    "SqliteFences": "pubsub_filter.consumer.stores.sqlite",
    "FirestoreFences": "pubsub_filter.consumer.stores.firestore",
    "ConfigError": "pubsub_filter.core.config.schema",
    "EnvelopeError": "pubsub_filter.core.envelope",
    "StoreUnavailable": "pubsub_filter.core.ports",
    "PublishFailed": "pubsub_filter.core.ports",
}

__all__ = [
    "Admission",
    "ConfigError",
    "Decision",
    "DecisionRecord",
    "EnvelopeError",
    "FenceContended",
    "FenceError",
    "Fences",
    "Filter",
    "FilterClosed",
    "FilterError",
    "FilterTypeError",
    "FilterUsageError",
    "FirestoreFences",
    "Forward",
    "Message",
    "Nack",
    "Outcome",
    "PublishFailed",
    "ResultNotStored",
    "SqliteFences",
    "StoreUnavailable",
    "SyncFilter",
    "UnknownRouteError",
    "__version__",
    "on_cloudevent",
    "on_payload",
    "on_push",
    "payload_message",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pubsub_filter' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
