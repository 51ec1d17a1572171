"""The engine in-process: decide one message and, when it is a forward, run the caller's work under the lease.

The same decision as the sidecar, with the caller's work in place of the publish
(`Engine.handle(..., act=...)`): claim the fenced lease, run the body while the heartbeat
keeps the lease, commit the new fingerprint only after the body returned. So:

- the body runs only for a forward; any other decision says why it did not run;
- a body that raises releases the lease, commits nothing, and the exception propagates
  (the caller nacks; the redelivery runs the body again);
- a process that dies inside the body leaves its lease to expire; the redelivery takes it over.

`Filter` is the async API, `SyncFilter` runs one on its own event-loop thread for plain
code (the body still runs on the caller's thread). Same config file, stores, records and
logs as `pubsub-filter serve` (`filter.runtime.wiring`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Generic, TypeVar

from filter.core.attributes import ATTR_FENCE, ATTR_KEY, ATTR_KEY_SHA256
from filter.core.config import Config, load
from filter.core.engine import Engine
from filter.core.model import Decision, DecisionRecord, Message
from filter.core.ports import Clock, PublishFailed
from filter.runtime.wiring import make_recorder, make_store

T = TypeVar("T")

#: What a decision record shows as `published_id` when the caller's work ran in place of a publish.
IN_PROCESS = "in-process"


@dataclass(frozen=True, slots=True)
class Forward:
    """What the body runs on: what the sidecar would have published for this forward.

    `data` is the payload forwarded (only the new and changed rows on a `rows_mode: changed`
    route); `attributes` carry the filter's own (`filter_fingerprint`, `filter_fence`, ...).
    """

    route: str
    data: bytes
    attributes: Mapping[str, str]

    @property
    def key(self) -> str | None:
        return self.attributes.get(ATTR_KEY)

    @property
    def key_sha256(self) -> str | None:
        return self.attributes.get(ATTR_KEY_SHA256)

    @property
    def fence(self) -> int | None:
        """The lease's fencing token; None when the body runs without a lease (shadow mode, fail-open)."""
        fence = self.attributes.get(ATTR_FENCE)
        return int(fence) if fence is not None else None


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """The decision on one message, and whether the body ran.

    `acked`: ack the message (the body ran and returned, or it had no need to run).
    Otherwise nack it: `contended` (other content for the key is in flight), `failed`
    (the store could not decide, `on_store_error: retry`) or `rejected` (not understood).
    `committed` is False when the body ran and returned but the filter could not record it
    (the store failed, or the lease was taken over while the body ran): the body's effect is
    done, so ack; the next copy of this content runs the body again.
    """

    record: DecisionRecord
    ran: bool = False
    result: T | None = field(default=None)

    @property
    def decision(self) -> Decision:
        return self.record.decision

    @property
    def reason(self) -> str | None:
        return self.record.reason

    @property
    def acked(self) -> bool:
        return self.record.acked

    @property
    def committed(self) -> bool:
        return self.ran and self.record.extra.get("committed", True) is not False and self.record.fence is not None

    @property
    def skipped(self) -> bool:
        """The body did not run because it had no need to (unchanged, duplicate, stale...)."""
        return self.acked and not self.ran


class _NoPublisher:
    """In-process, every forward runs the caller's work: nothing is published."""

    async def publish(
        self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None = None
    ) -> str:
        raise PublishFailed("the in-process API runs the caller's work, never a publish")

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None


def _config(config: Config | str | os.PathLike[str] | None) -> Config:
    return config if isinstance(config, Config) else load(config)


class Filter:
    """The async API. `async with Filter.open("filter.yaml") as f: outcome = await f.process(...)`."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @classmethod
    def open(cls, config: Config | str | os.PathLike[str] | None = None, clock: Clock | None = None) -> Filter:
        """A config (or a path to one: default $PUBSUB_FILTER_CONFIG, then ./filter.yaml) → its stores and records."""
        cfg = _config(config)
        return cls(Engine(cfg, make_store(cfg), _NoPublisher(), make_recorder(cfg), clock))

    async def process(
        self,
        route: str,
        message: Message,
        body: Callable[[Forward], Awaitable[T]],
        trace: str | None = None,
    ) -> Outcome[T]:
        """Decide `message` on `route`; when it is a forward, await `body` under the lease, then commit.

        Raises what `body` raised (nothing committed, the lease released).
        """
        ran: list[T] = []
        failed: list[BaseException] = []

        async def act(data: bytes, attributes: Mapping[str, str]) -> str:
            try:
                ran.append(await body(Forward(route, data, attributes)))
            except BaseException as exc:
                failed.append(exc)
                raise
            return IN_PROCESS

        rec = await self.engine.handle(route, message, trace, act)
        if failed:
            raise failed[0]
        return Outcome(rec, ran=bool(ran), result=ran[0] if ran else None)

    async def close(self) -> None:
        """Write the records still waiting, then close the stores."""
        await self.engine.close()

    async def __aenter__(self) -> Filter:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class SyncFilter:
    """The sync API: a `Filter` on an event loop of its own (a daemon thread), bodies on the caller's thread.

    The caller's thread runs the body (its thread-local connections and transactions stay
    valid) while the loop thread keeps the lease alive with the heartbeat.
    """

    def __init__(self, config: Config | str | os.PathLike[str] | None = None):
        cfg = _config(config)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pubsub-filter", daemon=True)
        self._thread.start()

        async def build() -> Filter:  # clients made on the loop that will use them
            return Filter.open(cfg)

        self.filter = self._call(build())
        self.engine = self.filter.engine

    def _call(self, coro: Awaitable[T]) -> T:
        """`coro` run on the filter's loop (its stores and records are that loop's), waited for here."""
        return asyncio.run_coroutine_threadsafe(_awaited(coro), self._loop).result()

    def process(
        self, route: str, message: Message, body: Callable[[Forward], T], trace: str | None = None
    ) -> Outcome[T]:
        """Decide `message` on `route`; when it is a forward, run `body` here under the lease, then commit.

        Raises what `body` raised (nothing committed, the lease released).
        """
        # The loop asks for the body through `calls`; the decision's end arrives there too (None).
        calls: queue.SimpleQueue[tuple[Forward, concurrent.futures.Future[T]] | None] = queue.SimpleQueue()

        async def run_here(forward: Forward) -> T:
            done: concurrent.futures.Future[T] = concurrent.futures.Future()
            calls.put((forward, done))
            return await asyncio.wrap_future(done)

        decided = asyncio.run_coroutine_threadsafe(self.filter.process(route, message, run_here, trace), self._loop)
        decided.add_done_callback(lambda _: calls.put(None))
        while (call := calls.get()) is not None:
            forward, done = call
            try:
                done.set_result(body(forward))
            except BaseException as exc:
                done.set_exception(exc)
        return decided.result()

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._call(self.filter.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> SyncFilter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


async def _awaited(coro: Awaitable[T]) -> T:
    return await coro
