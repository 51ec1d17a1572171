"""The engine in-process: decide one message and, when it is a forward, run the caller's work under the lease.

The same decision as the sidecar, with the caller's work in place of the publish (the body
is the forward's sender, `Engine.handle(..., via=...)`): claim the fenced lease, run the body
while the heartbeat keeps the lease, commit the new fingerprint only after the body returned. So:

- the body runs only for a forward; any other decision says why it did not run;
- a body that raises, whatever it raises (`KeyboardInterrupt`, `StopIteration`... too), or
  that the caller cancels, releases the lease, commits nothing, is recorded `failed`, and
  the exception propagates (the caller nacks; the redelivery runs the body again);
- a body that returned is committed, its result kept with it (`cache_result`) when it can be;
- a body the API cannot run (an `async def` under `SyncFilter`) is refused before any claim;
- a process that dies inside the body leaves its lease to expire; the redelivery takes it over.

`Filter` is the async API, `SyncFilter` runs one on its own event-loop thread for plain
code (the body still runs on the caller's thread). Same config file, stores, records and
logs as `pubsub-filter serve` (`pubsub_filter.runtime.wiring`). `close()` waits for the calls
under way; a call after it raises `FilterClosed`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import os
import queue
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, TypeVar

import msgspec

from pubsub_filter.core.config.schema import CONFIG_ENV, DEFAULT_CONFIG, Config, ConfigError, load
from pubsub_filter.core.engine.answer import answer_for
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.errors import FilterError, FilterTypeError, FilterUsageError
from pubsub_filter.core.logs import get_logger
from pubsub_filter.core.model import Decision, DecisionRecord, Message
from pubsub_filter.core.ports import Clock, Worked
from pubsub_filter.inprocess.body import BodySender, Forward, WorkFailed
from pubsub_filter.inprocess.messages import to_message
from pubsub_filter.runtime import durability
from pubsub_filter.runtime.wiring import make_recorder, make_store

__all__ = ["Filter", "FilterClosed", "Forward", "Outcome", "SyncFilter"]

T = TypeVar("T")

log = get_logger("pubsub_filter.inprocess")


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
    #: `result` is the one kept when this message was forwarded (`cache_result`): a redelivery.
    cached: bool = False

    @property
    def decision(self) -> Decision:
        return self.record.decision

    @property
    def reason(self) -> str | None:
        return self.record.reason

    @property
    def acked(self) -> bool:
        return answer_for(self.record).ack

    @property
    def committed(self) -> bool:
        return self.ran and self.record.committed and self.record.fence is not None

    @property
    def skipped(self) -> bool:
        """The body did not run because it had no need to (unchanged, duplicate, stale...)."""
        return self.acked and not self.ran


#: what the in-process API builds from a config: the body sends, so no publisher
_PARTS = ("store", "records")


def _config(config: Config | str | os.PathLike[str] | None) -> Config:
    """The config, refused (`ConfigError`) when its state or records are files that the runtime
    loses (Cloud Run: `pubsub_filter.runtime.durability`), as `serve` refuses them. Asked before
    anything is built (`SyncFilter` starts a thread)."""
    cfg = config if isinstance(config, Config) else load(config)
    refused = durability.refusal(cfg, durability.detect(), parts=_PARTS)
    if refused:
        named = config or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG
        source = "<config>" if isinstance(config, Config) else str(named)
        raise ConfigError(source, refused)
    return cfg


class FilterClosed(FilterError, RuntimeError):
    """The filter was closed (or belongs to the process this one was forked from): open a new one."""


def is_async_function(fn: Callable[..., object]) -> bool:
    """`fn` is an `async def` (a coroutine function, marked as one, or an object whose `__call__` is)."""
    call = type(fn).__call__ if not inspect.isroutine(fn) else None  # an instance whose __call__ is async
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _name(fn: Callable[..., object]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


#: A config, or a path to one (default $PUBSUB_FILTER_CONFIG, then ./filter.yaml).
ConfigSource = Config | str | os.PathLike[str] | None


class Filter:
    """The async API. `async with Filter("filter.yaml") as f: outcome = await f.process(...)`.

    Built from a config (or a path to one), with its stores and records, as `SyncFilter` is;
    or around an `Engine` already built.
    """

    def __init__(self, config: Engine | ConfigSource = None, clock: Clock | None = None):
        if isinstance(config, Engine):
            self.engine = config
        else:
            cfg = _config(config)
            loss = durability.loss_line(cfg, parts=_PARTS)  # started anyway, by the experiment's variable
            if loss is not None:
                get_logger("pubsub_filter").error("embedded_backends_on_cloud_run", **loss)
            self.engine = Engine(cfg, make_store(cfg), None, make_recorder(cfg), clock)  # each call sends via its body
        self.closed = False
        self._unkept_said: set[str] = set()  # routes whose uncached result was logged (once a route)

    @classmethod
    def open(cls, config: ConfigSource = None, clock: Clock | None = None) -> Filter:
        """The same as `Filter(config, clock)`."""
        return cls(config, clock)

    async def process(
        self,
        route: str,
        message: object,
        body: Callable[[Forward], Awaitable[T]],
        trace: str | None = None,
        *,
        message_id: str | None = None,
        attributes: Mapping[str, str] | None = None,
        publish_time: float | None = None,
        cache_result: bool | None = None,
    ) -> Outcome[T]:
        """Decide `message` on `route`; when it is a forward, await `body` under the lease, then commit.

        `cache_result` (default: the route's `cache_result`) keeps the body's result, JSON-encoded,
        with the forward: a redelivery of this message (the same id and content) then returns it
        as `Outcome.result` (`cached`), decoded from JSON. A result that cannot be kept (not
        JSON-encodable, more than `RESULTS_MAX_BYTES` encoded) is not kept, and nothing else
        changes: the body returned, so the forward is committed like any other (the caller
        gets the result in this outcome), and a redelivery of this message is a duplicate that
        does not run the body and returns no result (`result` None, `cached` False). The first
        such result on each route of this `Filter` is logged (a `result_not_kept` warning,
        saying why), later ones are not.

        `message` is what the caller holds: a `Message`, a raw payload (bytes, str, dict, list;
        with `message_id=`, `attributes=`, `publish_time=` if it has them), a google-cloud-pubsub
        message or a push envelope dict (`pubsub_filter.inprocess.messages`); anything else raises
        `FilterTypeError` before any decision.

        Raises what `body` raised, whatever it is (nothing committed, the lease released, the
        decision recorded `failed`). The caller's cancel while the body runs reaches the body
        and ends the same way: the `CancelledError` propagates (a timeout then raises as usual).
        """
        msg = to_message(message, message_id=message_id, attributes=attributes, publish_time=publish_time)
        if self.closed:
            raise FilterClosed("this Filter is closed: open a new one")
        # Counted among the engine's decisions under way from here on (`Engine.under_way`, which
        # `close` waits on): `handle` takes it in before its first await, so no close slips between.
        return await self._process(route, msg, body, trace, self._caches(route, cache_result))

    def _caches(self, route: str, asked: bool | None) -> bool:
        facts = self.engine.facts.routes.get(route)
        return asked if asked is not None else facts is not None and facts.cache_result

    async def _process(
        self, route: str, message: Message, body: Callable[[Forward], Awaitable[T]], trace: str | None, cache: bool
    ) -> Outcome[T]:
        try:
            handled = await self.engine.handle(route, message, trace, BodySender(route, body, cache))
        except WorkFailed as failed:
            raised = failed.raised
        else:
            rec, worked = handled.record, handled.sent
            if not isinstance(worked, Worked):  # the body did not run (a BodySender sends nothing else)
                if cache and handled.kept is not None:
                    return Outcome(rec, result=msgspec.json.decode(handled.kept), cached=True)
                return Outcome(rec)
            if worked.unkept is not None:
                self._say_unkept(rec, worked.unkept)
            return Outcome(rec, ran=True, result=worked.returned)
        raise raised  # what the body raised, outside the handler: its own context, not ours

    def _say_unkept(self, rec: DecisionRecord, why: str) -> None:
        """Once a route per `Filter`: a body that returns what cannot be kept usually always does,
        and a line per message would drown the log the decision lines are in."""
        if rec.route in self._unkept_said:
            return
        self._unkept_said.add(rec.route)
        log.warning(
            "result_not_kept",
            route=rec.route,
            message_id=rec.message_id,
            reason=why,
            committed=rec.committed,
            note="the forward is committed without its result: a redelivery returns none; logged once a route",
        )

    async def close(self) -> None:
        """Wait for the calls under way in other tasks (each ends when its body does), then write the
        records still waiting and close the stores. Calls after it raise `FilterClosed`."""
        if self.engine.deciding_here():
            raise FilterUsageError("Filter.close() from inside its own body would wait for itself")
        if self.closed:
            return
        self.closed = True
        while under_way := self.engine.under_way():
            await asyncio.wait(under_way)
        await self.engine.close()

    async def __aenter__(self) -> Filter:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


#: What the caller's thread hands the loop for one body: its result, or why it did not return.
_Call = tuple[Forward, concurrent.futures.Future[Any]]


class SyncFilter:
    """The sync API: a `Filter` on an event loop of its own (a daemon thread), bodies on the caller's thread.

    The caller's thread runs the body (its thread-local connections and transactions stay
    valid) while the loop thread keeps the lease alive with the heartbeat. Usable from many
    threads at once; `close()` waits for the calls under way. A `SyncFilter` belongs to the
    process that opened it: a child forked after that opens its own.
    """

    def __init__(self, config: ConfigSource = None, clock: Clock | None = None):
        cfg = _config(config)
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pubsub-filter", daemon=True)
        self._thread.start()
        # Calls under way, by the thread making them: not the engine's registry (`Engine.under_way`),
        # which lives on the loop thread and holds a call only once its decision reached the loop.
        # This one is counted on the caller's thread, under the same lock as the closing flag, so
        # a call either is refused or is waited for by `close()`; it also covers the caller's wait
        # for the loop and the body run on the caller's thread, and tells a close from inside a body.
        self._calls: Counter[int] = Counter()
        self._idle = threading.Condition()  # notified as each call ends; guards _calls and _closing
        self._closing = False
        self._closed = threading.Lock()  # held by the one close() that does the closing

        async def build() -> Filter:  # clients made on the loop that will use them
            return Filter(cfg, clock)

        self.filter = self._run(build())
        self.engine = self.filter.engine

    @property
    def closing(self) -> bool:
        """`close()` has begun: new calls raise `FilterClosed`."""
        return self._closing

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """`coro` run on the filter's loop (its stores and records are that loop's), waited for here."""
        return asyncio.run_coroutine_threadsafe(_awaited(coro), self._loop).result()

    def _call(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """`make()` run on the loop as one call of the filter's: refused once closed, waited for by `close()`."""
        with self._entered():
            return self._run(make())

    @contextlib.contextmanager
    def _entered(self) -> Iterator[None]:
        """One call of the filter's, from this thread: counted while it runs, refused once closing."""
        if os.getpid() != self._pid:  # checked before any lock: one held at the fork stays held here
            raise FilterClosed(
                f"this SyncFilter was opened in process {self._pid}, before a fork: its event-loop thread "
                "does not exist in this process; open a new SyncFilter in the child"
            )
        me = threading.get_ident()
        with self._idle:
            if self._closing:
                raise FilterClosed("this SyncFilter is closed: open a new one")
            self._calls[me] += 1
        try:
            yield
        finally:
            with self._idle:
                self._calls[me] -= 1
                if not self._calls[me]:
                    del self._calls[me]
                self._idle.notify_all()

    def process(
        self,
        route: str,
        message: object,
        body: Callable[[Forward], T],
        trace: str | None = None,
        *,
        message_id: str | None = None,
        attributes: Mapping[str, str] | None = None,
        publish_time: float | None = None,
        cache_result: bool | None = None,
    ) -> Outcome[T]:
        """Decide `message` on `route`; when it is a forward, run `body` here under the lease, then commit.

        `message` is what the caller holds, and `cache_result` keeps the result, as for `Filter.process`.

        Raises what `body` raised, whatever it is (nothing committed, the lease released, the
        decision recorded `failed`). An `async def` body is refused (`TypeError`) before any
        claim; a body that returns an awaitable anyway fails its message the same way.
        """
        if is_async_function(body):
            raise FilterTypeError(
                f"{_name(body)} is an async def: SyncFilter runs a plain function's body; "
                "use Filter (the async API) for a coroutine function"
            )
        msg = to_message(message, message_id=message_id, attributes=attributes, publish_time=publish_time)
        with self._entered():
            return self._process(route, msg, body, trace, cache_result)

    def _process(
        self, route: str, message: Message, body: Callable[[Forward], T], trace: str | None, cache: bool | None
    ) -> Outcome[T]:
        # The loop asks for the body through `calls`; the decision's end arrives there too (None).
        calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()

        async def run_here(forward: Forward) -> T:
            done: concurrent.futures.Future[T] = concurrent.futures.Future()
            calls.put((forward, done))
            return await asyncio.wrap_future(done)

        # A Ctrl-C lands wherever this thread is, even between the decision's submission and the
        # line after it. So the decision never runs unseen: it starts only if this call has not
        # given up on it, and a call that gives up cancels it on the loop, where the decision
        # starts too (one of the two comes first there, and each sees what the other did).
        abandoned = threading.Event()
        started: list[asyncio.Task[Any]] = []

        async def decide() -> Outcome[T]:
            if abandoned.is_set():
                raise asyncio.CancelledError
            started.append(asyncio.current_task())  # type: ignore[arg-type]
            return await self.filter.process(route, message, run_here, trace, cache_result=cache)

        try:
            decided = asyncio.run_coroutine_threadsafe(decide(), self._loop)
            decided.add_done_callback(lambda _: calls.put(None))
            while (call := calls.get()) is not None:
                _run_body(body, *call)
        except BaseException:
            # Interrupted while waiting for the loop (a Ctrl-C): the body cannot run here any
            # more, so the decision is cancelled (the lease released, `failed` recorded).
            abandoned.set()
            self._loop.call_soon_threadsafe(_cancel_each, started)
            raise
        try:
            return decided.result()
        except WorkFailed as failed:
            raised = failed.__cause__ or failed
        raise raised  # the decision is over (recorded `failed`): the body's own exception, as it was

    def close(self) -> None:
        """Wait for the calls under way on other threads (each ends when its body does), then write
        the records still waiting and close the stores. Calls after it raise `FilterClosed`."""
        if os.getpid() != self._pid:
            return  # a forked child: the loop, the stores and the records are the parent's
        me = threading.get_ident()
        with self._idle:
            if self._calls[me]:
                raise FilterUsageError("SyncFilter.close() from inside its own body would wait for itself")
            self._closing = True
            self._idle.wait_for(lambda: not self._calls)
        with self._closed:
            if not self._thread.is_alive():
                return
            try:
                self._run(self.filter.close())
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


def _cancel_each(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()


def _run_body(body: Callable[[Forward], T], forward: Forward, done: concurrent.futures.Future[T]) -> None:
    """Run `body` on this (the caller's) thread and tell the loop how it ended.

    The loop gets the result, or a `WorkFailed` saying what the body raised: the loop cannot
    carry the exception itself (`StopIteration` cannot be set on a future, a `KeyboardInterrupt`
    would end the loop's thread). The `WorkFailed` comes back out of the decision, and the
    caller gets the body's own exception, its `__cause__`.
    """
    if not done.set_running_or_notify_cancel():
        return  # the decision was cancelled before its body ran
    try:
        result = body(forward)
    except BaseException as exc:  # re-raised on this thread once the decision is over
        done.set_exception(_failed(f"{type(exc).__name__}: {exc}", exc))
        return
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never to run: not left to warn that it was never awaited
        error = FilterTypeError(
            f"the body returned an awaitable ({type(result).__name__}): it was not run; SyncFilter runs a "
            "plain function's body, use Filter (the async API) for an async def"
        )
        done.set_exception(_failed(f"TypeError: {error}", error))
        return
    done.set_result(result)


def _failed(description: str, exc: BaseException) -> WorkFailed:
    """A `WorkFailed` the loop can carry (it raises itself there) for `exc`, raised on the caller's thread."""
    failed = WorkFailed(description)
    failed.__cause__ = exc
    return failed


async def _awaited(coro: Coroutine[Any, Any, T]) -> T:
    return await coro
