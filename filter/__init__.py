"""pubsub-filter: forward a Pub/Sub message downstream only when its content changed.

The library's public surface is what `__all__` lists; everything else is internal and may move.

    from filter import SyncFilter
    with SyncFilter("filter.yaml") as f:
        outcome = f.process("route", b'{"id": 1}', lambda forward: rebuild(forward.data))

    from filter import Filter
    async with Filter("filter.yaml") as f:
        outcome = await f.process("route", payload, body, message_id="m1")

Every error the library raises derives from `FilterError`. The library does not configure
logging: its loggers are under `pubsub_filter` in the standard `logging` tree (silent until the
application configures logging, see `filter.core.logs`); the `pubsub-filter` commands configure
it for themselves.
"""

from __future__ import annotations

import importlib

from filter._version import __version__
from filter.core.errors import FilterError, FilterTypeError, FilterUsageError, ResultNotStored, UnknownRouteError

# Not `typing.TYPE_CHECKING`: importing typing would triple the cost of `import filter` (type
# checkers treat any name TYPE_CHECKING as true).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from filter.backends.fences.firestore import FirestoreFences
    from filter.backends.fences.sqlite import SqliteFences
    from filter.core.config import ConfigError
    from filter.core.envelope import EnvelopeError
    from filter.core.fence import Admission, FenceContended, FenceError, Fences
    from filter.core.model import Decision, DecisionRecord, Message
    from filter.core.ports import PublishFailed, StoreUnavailable
    from filter.inprocess.api import Filter, FilterClosed, Forward, Outcome, SyncFilter
    from filter.inprocess.handlers import Nack, on_cloudevent, on_payload, on_push
    from filter.inprocess.messages import payload_message

#: name → the module that defines it, imported on first use: `import filter` stays cheap.
_LAZY = {
    "Filter": "filter.inprocess.api",
    "SyncFilter": "filter.inprocess.api",
    "Outcome": "filter.inprocess.api",
    "Forward": "filter.inprocess.api",
    "FilterClosed": "filter.inprocess.api",
    "on_payload": "filter.inprocess.handlers",
    "on_push": "filter.inprocess.handlers",
    "on_cloudevent": "filter.inprocess.handlers",
    "Nack": "filter.inprocess.handlers",
    "payload_message": "filter.inprocess.messages",
    "Message": "filter.core.model",
    "Decision": "filter.core.model",
    "DecisionRecord": "filter.core.model",
    "Fences": "filter.core.fence",
    "Admission": "filter.core.fence",
    "FenceError": "filter.core.fence",
    "FenceContended": "filter.core.fence",
    "SqliteFences": "filter.backends.fences.sqlite",
    "FirestoreFences": "filter.backends.fences.firestore",
    "ConfigError": "filter.core.config",
    "EnvelopeError": "filter.core.envelope",
    "StoreUnavailable": "filter.core.ports",
    "PublishFailed": "filter.core.ports",
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
        raise AttributeError(f"module 'filter' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
