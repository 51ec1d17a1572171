"""The in-process surface: the filter as a library around the caller's own work.

`Filter` (async) and `SyncFilter` wrap the caller's side effect in the same decision as
push and pull; `pubsub_filter.inprocess.handlers` has decorators for functions that take a
payload, a push envelope or a CloudEvent.
"""

from pubsub_filter.inprocess.api import Filter, FilterClosed, Forward, Outcome, SyncFilter

__all__ = ["Filter", "FilterClosed", "Forward", "Outcome", "SyncFilter"]
