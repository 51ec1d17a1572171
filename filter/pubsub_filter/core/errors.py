"""The library's root exception, and the errors of its public surface that have no other home.

Every error class the library defines derives from `FilterError`, beside the standard base it
always had (a `FenceError` is still a `ValueError`, `FilterClosed` still a `RuntimeError`), so
a caller can catch everything the filter raises with one clause and existing clauses still work.
Imports nothing: any module may derive from it.
"""

from __future__ import annotations


class FilterError(Exception):
    """The root of every error pubsub-filter raises."""


class FilterTypeError(FilterError, TypeError):
    """A value the library cannot take: a message it cannot read as one, a body it cannot run."""


class UnknownRouteError(FilterError, ValueError):
    """A route name that the filter's config does not define."""


class FilterUsageError(FilterError, RuntimeError):
    """A call the filter cannot honour where it was made (closing a filter from inside its own body)."""


class ResultNotStored(FilterError, ValueError):
    """Why a body's result cannot be kept by a `cache_result` route (not JSON-encodable, or too large).

    Not raised to the caller: the body returned, so the forward is committed without its
    result (a redelivery returns `result` None, `cached` False) and the reason is logged, a
    `result_not_kept` warning once a route per filter. Exported as the name of that reason."""
