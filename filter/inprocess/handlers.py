"""Decorators for a processor's handler: run the body only for a forward, under the lease.

Three shapes of handler, each for a `SyncFilter` (plain functions) or a `Filter` (async
functions):

- `on_payload(f, route)`: `fn(payload)`; call it as `fn(payload, attributes=..., message_id=...)`.
  The body gets the payload forwarded (decoded JSON, or bytes when it is not JSON).
- `on_push(f, route)`: `fn(envelope)` for a Pub/Sub push body (bytes, text or the decoded dict).
- `on_cloudevent(f, route)`: `fn(event)` for a functions-framework CloudEvent of a Pub/Sub
  message (`data.message` with base64 `data`, `attributes`, `messageId`, `publishTime`).

The push and CloudEvent bodies get the event they were called with. Every wrapper returns
the `Outcome` (`outcome.skipped`: the content was unchanged, the body did not run), and
raises `Nack` for a decision that must be redelivered (contended, failed, rejected): the
platform then retries, as the sidecar's non-2xx answer would make it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, overload

import msgspec

from filter.core.answer import answer_for
from filter.core.canonical import plain_decode
from filter.core.engine import Engine
from filter.core.envelope import EnvelopeError
from filter.core.errors import FilterError, FilterTypeError, UnknownRouteError
from filter.core.model import Message
from filter.inprocess.api import Filter, Forward, Outcome, SyncFilter, is_async_function
from filter.inprocess.messages import payload_message, push_message

T = TypeVar("T")

ToMessage = Callable[..., Message]
SyncDecorator = Callable[[Callable[..., T]], Callable[..., Outcome[T]]]
AsyncDecorator = Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[Outcome[T]]]]


class Nack(FilterError):
    """The message must be redelivered: the decision was not one to ack. `status` is what the sidecar answers."""

    def __init__(self, outcome: Outcome[Any]):
        super().__init__(f"{outcome.decision}: {outcome.reason}")
        self.outcome = outcome

    @property
    def status(self) -> int:
        return answer_for(self.outcome.record).status


# --- messages from each handler shape ------------------------------------------------


def cloudevent_message(event: Any) -> Message:
    """A functions-framework CloudEvent for a Pub/Sub message (its `data` carries the push envelope's fields)."""
    data = event.data if hasattr(event, "data") else event.get("data") if isinstance(event, Mapping) else None
    if not isinstance(data, Mapping) or not isinstance(data.get("message"), Mapping):
        raise EnvelopeError("not a Pub/Sub CloudEvent: its data has no message object")
    return push_message({"message": data["message"], "subscription": data.get("subscription")})


def _payload_of(forward: Forward) -> Any:
    try:
        return plain_decode(forward.data)  # a number beyond double range as its decimal
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return forward.data


# --- the decorators --------------------------------------------------------------------


_UNREADABLE = (EnvelopeError, TypeError, msgspec.EncodeError)


async def _rejected(engine: Engine, route: str, exc: Exception) -> Outcome[Any]:
    """Recorded and logged as the sidecar records a body it cannot read, and, as there, the
    answer (the Nack) waits for the commit that holds the record. Runs on the filter's loop:
    the records' connection is the loop's, and a commit of its may be open."""
    return Outcome(await engine.reject(route, None, str(exc), message_id=getattr(exc, "message_id", None)))


def _acked(outcome: Outcome[T]) -> Outcome[T]:
    if not outcome.acked:
        raise Nack(outcome)
    return outcome


def _refuse_unrunnable(f: Filter | SyncFilter, fn: Callable[..., Any]) -> None:
    """A handler the filter cannot run is refused here, before any message: a coroutine function
    under a `SyncFilter` would be recorded as run without running, a plain function under a
    `Filter` would run and then fail its message on every delivery."""
    name = getattr(fn, "__qualname__", repr(fn))
    if isinstance(f, SyncFilter) and is_async_function(fn):
        raise FilterTypeError(f"{name} is an async def: decorate it for a Filter (the async API), not a SyncFilter")
    if isinstance(f, Filter) and not is_async_function(fn):
        raise FilterTypeError(
            f"{name} is not an async def: a Filter (the async API) awaits its handler; "
            "decorate a plain function for a SyncFilter"
        )


def _known_route(engine: Engine, route: str) -> None:
    """A decorator for a route the config does not define would reject every message: refused now."""
    if route not in engine.rules:
        known = ", ".join(sorted(engine.rules)) or "none"
        raise UnknownRouteError(f"unknown route {route!r}: the config defines {known}")


def _decorator(
    f: Filter | SyncFilter, route: str, to_message: ToMessage, gives_payload: bool, cache_result: bool | None
) -> Any:
    engine = f.engine
    _known_route(engine, route)

    def body_args(forward: Forward, args: Any) -> Any:
        return _payload_of(forward) if gives_payload else args[0]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        _refuse_unrunnable(f, fn)
        if isinstance(f, Filter):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kw: Any) -> Outcome[Any]:
                try:
                    msg = to_message(*args, **kw)
                except _UNREADABLE as exc:
                    raise Nack(await _rejected(engine, route, exc)) from exc
                done = f.process(route, msg, lambda fwd: fn(body_args(fwd, args)), cache_result=cache_result)
                return _acked(await done)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Outcome[Any]:
            assert isinstance(f, SyncFilter)
            try:
                msg = to_message(*args, **kw)
            except _UNREADABLE as exc:
                unreadable = exc
                raise Nack(f._call(lambda: _rejected(engine, route, unreadable))) from exc
            return _acked(f.process(route, msg, lambda fwd: fn(body_args(fwd, args)), cache_result=cache_result))

        return wrapper

    return decorate


class _Shape:
    """The decorator factory of one handler shape: `shape(f, route)` decorates for a `SyncFilter` or a `Filter`."""

    def __init__(self, to_message: ToMessage, gives_payload: bool, doc: str):
        self.to_message = to_message
        self.gives_payload = gives_payload
        self.__doc__ = doc

    @overload
    def __call__(self, f: SyncFilter, route: str, *, cache_result: bool | None = None) -> SyncDecorator[Any]: ...
    @overload
    def __call__(self, f: Filter, route: str, *, cache_result: bool | None = None) -> AsyncDecorator[Any]: ...
    def __call__(self, f: Filter | SyncFilter, route: str, *, cache_result: bool | None = None) -> Any:
        """`cache_result`: keep the handler's result for a redelivery (default: the route's `cache_result`)."""
        return _decorator(f, route, self.to_message, self.gives_payload, cache_result)


on_payload = _Shape(
    payload_message,
    gives_payload=True,
    doc="`fn(payload)`, called as `fn(payload, attributes=None, message_id=None, publish_time=None)`.",
)
on_push = _Shape(
    push_message,
    gives_payload=False,
    doc="`fn(envelope)` for a Pub/Sub push body; the body gets the envelope as it was called with it.",
)
on_cloudevent = _Shape(
    cloudevent_message,
    gives_payload=False,
    doc="`fn(event)` for a functions-framework CloudEvent of a Pub/Sub message.",
)
