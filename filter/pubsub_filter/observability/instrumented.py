"""The store and the publisher, measured and traced, around whatever backends the config names:
outside `GuardedStore`, so that a store call's latency and span include its retries."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from typing import Generic, TypeVar

from pubsub_filter.core.model import KeyState
from pubsub_filter.core.ports import Publisher, StateStore
from pubsub_filter.observability.telemetry import Telemetry

T = TypeVar("T")
Inner = TypeVar("Inner", StateStore, Publisher)


class _Instrumented(Generic[Inner]):
    """A backend and the telemetry that measures it; probes and the close go straight through."""

    def __init__(self, inner: Inner, telemetry: Telemetry) -> None:
        self.inner: Inner = inner
        self.telemetry = telemetry

    def _measured(self, histogram: str, started: float, **labels: str) -> None:
        if self.telemetry.metrics:
            self.telemetry.latency[histogram].record(time.perf_counter() - started, labels)

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()


class InstrumentedStore(_Instrumented[StateStore]):
    async def _timed(self, operation: str, route: str, call: Awaitable[T]) -> T:
        t = self.telemetry
        started = time.perf_counter()
        outcome = "error"
        try:
            if t.recording():
                # a child span, not made current (nothing inside a store call reads it), that
                # records what the call raised, and ends, as it leaves
                with t.tracer.start_span(f"store {operation}", attributes={"pubsub_filter.route": route}):
                    result = await call
            else:
                result = await call
            outcome = "ok"
            return result
        finally:
            self._measured("store", started, operation=operation, outcome=outcome)

    async def read(self, route: str, key: str) -> KeyState | None:
        return await self._timed("read", route, self.inner.read(route, key))

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        return await self._timed("claim", route, self.inner.claim(route, key, seen, new))

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        # A heartbeat: an event on the publish it keeps alive (`Heartbeat`), not a span of its own.
        t = self.telemetry
        started = time.perf_counter()
        try:
            extended = await self.inner.extend(route, key, held, expires_at)
        except Exception:  # a cancelled heartbeat (its publish ended) is not measured
            self._measured("store", started, operation="extend", outcome="error")
            if t.metrics:
                t.counters["heartbeat_failures"].add(1, {"route": route})
            raise
        self._measured("store", started, operation="extend", outcome="ok")
        return extended

    async def commit(self, route: str, key: str, held: KeyState, new: KeyState) -> bool:
        committed = await self._timed("commit", route, self.inner.commit(route, key, held, new))
        if not committed and self.telemetry.metrics:
            self.telemetry.counters["commit_refusals"].add(1, {"route": route})
        return committed

    async def release(self, route: str, key: str, held: KeyState) -> None:
        await self._timed("release", route, self.inner.release(route, key, held))


class InstrumentedPublisher(_Instrumented[Publisher]):
    async def publish(
        self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None = None
    ) -> str:
        # Its span is the decision's (`Traced.sending`, current here): the trace context it passes on.
        t = self.telemetry
        started = time.perf_counter()
        outcome = "error"
        try:
            outgoing = dict(attributes)
            t.inject(outgoing)
            published = await self.inner.publish(destination, data, outgoing, ordering_key)
            t.sent(published)
            outcome = "ok"
            return published
        finally:
            self._measured("publish", started, destination=destination, outcome=outcome)
