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

from pubsub_filter.core.compare.canonical import plain_decode
from pubsub_filter.core.engine.answer import answer_for
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import EnvelopeError
from pubsub_filter.core.errors import FilterError, FilterTypeError, UnknownRouteError
from pubsub_filter.core.model import Message
from pubsub_filter.inprocess.api import Filter, Forward, Outcome, SyncFilter, is_async_function
from pubsub_filter.inprocess.messages import payload_message, push_message

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
    routes = engine.facts.routes
    if route not in routes:
        known = ", ".join(sorted(routes)) or "none"
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


# Plain functions, not one callable class with three instances: each is a documented decorator
# in the API reference, with its own signature and overloads for type checkers.


@overload
def on_payload(f: SyncFilter, route: str, *, cache_result: bool | None = None) -> SyncDecorator[Any]: ...
@overload
def on_payload(f: Filter, route: str, *, cache_result: bool | None = None) -> AsyncDecorator[Any]: ...
def on_payload(f: Filter | SyncFilter, route: str, *, cache_result: bool | None = None) -> Any:
    """Decorate a handler of a payload: `fn(payload)`, run only when the content changed.

    Call the decorated function as `fn(payload, attributes=None, message_id=None,
    publish_time=None)`; `payload` is bytes, text or an already decoded JSON value. The body
    runs for a forward only, under the key's lease, and gets the payload forwarded (decoded
    JSON, or bytes when it is not JSON).

    ```python
    @on_payload(f, "injury-report")
    def rebuild(payload):
        ...

    outcome = rebuild(body, attributes={"source": "nbac"}, message_id="1001")
    ```

    Args:
        f: a `SyncFilter` (decorate a plain function) or a `Filter` (decorate an `async def`).
        route: the route of the config that decides the messages; an unknown route raises
            `UnknownRouteError` here, before any message.
        cache_result: keep what the body returned for a redelivery (default: the route's
            `cache_result`).

    Returns:
        The decorator. The decorated function returns the `Outcome` (`outcome.skipped`: the
        content was unchanged and the body did not run) and raises `Nack` for a decision that
        must be redelivered (contended, failed, rejected).
    """
    return _decorator(f, route, payload_message, True, cache_result)


@overload
def on_push(f: SyncFilter, route: str, *, cache_result: bool | None = None) -> SyncDecorator[Any]: ...
@overload
def on_push(f: Filter, route: str, *, cache_result: bool | None = None) -> AsyncDecorator[Any]: ...
def on_push(f: Filter | SyncFilter, route: str, *, cache_result: bool | None = None) -> Any:
    """Decorate a handler of a Pub/Sub push body: `fn(envelope)`, run only when the content changed.

    Call the decorated function with the push request's body (bytes, text or the decoded
    dict). The message id, publish time and attributes come from the envelope; the body gets
    the envelope as it was called with it.

    ```python
    @on_push(f, "injury-report")
    def rebuild(envelope):
        ...
    ```

    Args:
        f: a `SyncFilter` (decorate a plain function) or a `Filter` (decorate an `async def`).
        route: the route of the config that decides the messages; an unknown route raises
            `UnknownRouteError` here, before any message.
        cache_result: keep what the body returned for a redelivery (default: the route's
            `cache_result`).

    Returns:
        The decorator; the decorated function returns the `Outcome` or raises `Nack`, as
        `on_payload`'s does. A body that is no push envelope is recorded as rejected and
        raises `Nack`.
    """
    return _decorator(f, route, push_message, False, cache_result)


@overload
def on_cloudevent(f: SyncFilter, route: str, *, cache_result: bool | None = None) -> SyncDecorator[Any]: ...
@overload
def on_cloudevent(f: Filter, route: str, *, cache_result: bool | None = None) -> AsyncDecorator[Any]: ...
def on_cloudevent(f: Filter | SyncFilter, route: str, *, cache_result: bool | None = None) -> Any:
    """Decorate a handler of a functions-framework CloudEvent of a Pub/Sub message: `fn(event)`.

    The event's `data.message` holds the message (base64 `data`, `attributes`, `messageId`,
    `publishTime`), as Cloud Run functions deliver it. The body runs only when the content
    changed, and gets the event it was called with.

    ```python
    @functions_framework.cloud_event
    @on_cloudevent(f, "injury-report")
    def rebuild(event):
        ...
    ```

    Args:
        f: a `SyncFilter` (decorate a plain function) or a `Filter` (decorate an `async def`).
        route: the route of the config that decides the messages; an unknown route raises
            `UnknownRouteError` here, before any message.
        cache_result: keep what the body returned for a redelivery (default: the route's
            `cache_result`).

    Returns:
        The decorator; the decorated function returns the `Outcome` or raises `Nack`, as
        `on_payload`'s does.
    """
    return _decorator(f, route, cloudevent_message, False, cache_result)
