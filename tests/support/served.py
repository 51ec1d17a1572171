"""The push app served in-process as uvicorn serves it, with a publisher that can stall.

`ServedPush` runs `pubsub_filter.push.app.create_app` with its lifespan (the one `serve` gives it),
over the embedded SQLite store and records in a directory, and answers requests through
httpx's ASGI transport: each request is one task, as under uvicorn. `shutdown()` does what
uvicorn does on SIGTERM (wait the requests' share of `server.shutdown_budget`, cancel the ones still
running, run the lifespan's shutdown) and then what `asyncio.run` does to the tasks still left
(cancel them again).

`StallingPublisher` is our `Publisher` port with switches: `mode` is what the next publish
does (`ok` lands at once, `fail` raises `PublishFailed`, `stall` waits until the test settles
it with `settle`, or until the publisher's close does what `on_close` says: land it, as Pub/Sub's
`stop()` flushes what it holds, fail it, or nothing). What landed is `Downstream.landed`,
shared across restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx

from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.backends.records.inline import InlineSqliteRecorder
from pubsub_filter.backends.records.sqlite import SqliteSink
from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.attributes import ATTR_SOURCE_ID
from pubsub_filter.core.config.schema import Config
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import KeyState
from pubsub_filter.core.ports import Clock, PublishFailed, StateStore
from pubsub_filter.push.app import create_app, engine_lifespan

Mode = Literal["ok", "fail", "stall"]
T = TypeVar("T")

#: How long a test waits for any one request before calling it hung: a watchdog, never a wait.
WATCHDOG = 10.0


@dataclass
class Landed:
    """One publish that reached the destination."""

    destination: str
    data: bytes
    attributes: dict[str, str]
    confirmed: bool = True  # False: it landed after its caller stopped waiting (the caller was cancelled)

    @property
    def source_id(self) -> str:
        return self.attributes[ATTR_SOURCE_ID]


@dataclass
class Stalled:
    landed: Landed
    outcome: asyncio.Future[bool]
    on_close: bool | None  # what the publisher's close does to it: land, fail, or nothing (it never ends)
    lands_anyway: bool = False  # abandoned by its caller, it lands all the same (the client had sent it)


@dataclass
class Downstream:
    """What reached the destination, across every publisher (restarts)."""

    landed: list[Landed] = field(default_factory=list)


class StallingPublisher:
    """A `Publisher` whose publishes land, fail or stall, as `mode` says when each one starts."""

    def __init__(self, downstream: Downstream, on_close: bool | None = True) -> None:
        self.downstream = downstream
        self.mode: Mode = "ok"
        self.on_close = on_close  # what close does to a stalled publish: land (flush), fail, or nothing
        self.lands_anyway = False  # a stalled publish abandoned by its caller lands all the same
        self.stalled: list[Stalled] = []
        self.stalling = asyncio.Event()  # set when a publish stalls
        self.closed = False
        self._ids = itertools.count(1)

    async def publish(
        self, destination: str, data: bytes, attributes: Mapping[str, str], ordering_key: str | None = None
    ) -> str:
        if self.closed:
            raise PublishFailed("StallingPublisher: closed")
        landed = Landed(destination, data, dict(attributes))
        if self.mode == "fail":
            raise PublishFailed("StallingPublisher: failure switched on")
        if self.mode == "stall":
            stalled = Stalled(landed, asyncio.get_running_loop().create_future(), self.on_close, self.lands_anyway)
            self.stalled.append(stalled)
            self.stalling.set()
            try:
                if not await stalled.outcome:
                    raise PublishFailed("StallingPublisher: the stalled publish failed")
            except asyncio.CancelledError:
                # the caller stopped waiting: a publish settled meanwhile landed all the same,
                # and one the client had already sent may land too
                landed.confirmed = False
                if stalled.lands_anyway and not any(x is landed for x in self.downstream.landed):
                    self.downstream.landed.append(landed)
                raise
            finally:
                if stalled in self.stalled:
                    self.stalled.remove(stalled)
            return str(next(self._ids))
        self.downstream.landed.append(landed)
        return str(next(self._ids))

    def settle(self, index: int, ok: bool) -> None:
        """Let the stalled publish `index` (mod how many wait) land (`ok`) or fail."""
        waiting = self.waiting
        if waiting:
            self._settle(waiting[index % len(waiting)], ok)

    def _settle(self, stalled: Stalled, ok: bool) -> None:
        if ok:
            self.downstream.landed.append(stalled.landed)
        stalled.outcome.set_result(ok)

    @property
    def waiting(self) -> list[Stalled]:
        return [s for s in self.stalled if not s.outcome.done()]

    async def ping(self) -> None:
        if self.closed:
            raise PublishFailed("StallingPublisher: closed")

    async def close(self) -> None:
        self.closed = True
        for stalled in self.waiting:
            if stalled.on_close is not None:
                self._settle(stalled, stalled.on_close)


When = Literal["before", "after"]


class SlowStore:
    """A `StateStore` whose next call of an armed operation is held: `before` its write (the
    request is slow to reach the store) or `after` it (the write landed, its reply is slow),
    until the test lets it go with `reply`. A cancel meanwhile ends the call there."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        self.armed: dict[str, When] = {}
        self.held: list[asyncio.Future[None]] = []
        self.cut: Counter[str] = Counter()  # held calls a cancel ended, by "op/when"

    async def _hold(self, what: str) -> None:
        held = asyncio.get_running_loop().create_future()
        self.held.append(held)
        try:
            await held
        except asyncio.CancelledError:
            self.cut[what] += 1
            raise
        finally:
            self.held.remove(held)

    async def _call(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        when = self.armed.pop(op, None)
        if when == "before":
            await self._hold(f"{op}/before")
        result = await call()
        if when == "after":
            await self._hold(f"{op}/after")
        return result

    def reply(self, index: int | None = None) -> None:
        """Let the held call `index` (mod how many), or every one, go on."""
        waiting = [f for f in self.held if not f.done()]
        for held in waiting if index is None else waiting[index % len(waiting) :][:1]:
            held.set_result(None)

    async def read(self, route: str, key: str) -> KeyState | None:
        return await self._call("read", lambda: self.inner.read(route, key))

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        return await self._call("claim", lambda: self.inner.claim(route, key, seen, new))

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        return await self._call("extend", lambda: self.inner.extend(route, key, held, expires_at))

    async def commit(self, route: str, key: str, held: KeyState, new: KeyState) -> bool:
        return await self._call("commit", lambda: self.inner.commit(route, key, held, new))

    async def release(self, route: str, key: str, held: KeyState) -> None:
        await self._call("release", lambda: self.inner.release(route, key, held))

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()


@dataclass
class Answer:
    """What one push request got: a status and body, or the exception the app raised (a 500
    with a traceback under uvicorn)."""

    status: int | None
    body: dict[str, Any]
    raised: BaseException | None = None

    @property
    def acked(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class ServedPush:
    """One serving of the push app: `start()`, `post()` requests (tasks), `shutdown()`."""

    def __init__(
        self,
        config: Config,
        scratch: Path,
        publisher: StallingPublisher,
        clock: Clock,
        wrap_store: Callable[[StateStore], StateStore] = lambda s: s,
    ) -> None:
        self.config = config
        self.store_path = scratch / "state.db"
        self.records_path = scratch / "records.db"
        self.publisher = publisher
        inner = wrap_store(SqliteStore(self.store_path, clock=clock.now))
        store = GuardedStore(inner, config.store_errors, inline=True)
        recorder = InlineSqliteRecorder(
            SqliteSink(self.records_path), BatchingRecorder(SqliteSink(self.records_path), flush_interval=0.5)
        )
        self.engine = Engine(config, store, publisher, recorder, clock)
        self.app = create_app(self.engine, lifespan=lambda _app: engine_lifespan(self.engine))
        self.requests: list[asyncio.Task[Answer]] = []
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] | None = None
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> ServedPush:
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://filter")
        return self

    def post(self, route: str, body: bytes) -> asyncio.Task[Answer]:
        task = asyncio.create_task(self._post(route, body))
        self.requests.append(task)
        return task

    async def _post(self, route: str, body: bytes) -> Answer:
        assert self._client is not None
        try:
            r = await self._client.post(f"/push/{route}", content=body)
        # what uvicorn turns into a plain 500 and a traceback, or a cancel that never became an
        # answer (not other BaseExceptions: a test's own timeout must not be taken for an answer)
        except (Exception, asyncio.CancelledError) as exc:
            return Answer(None, {}, exc)
        return Answer(r.status_code, r.json() if r.headers.get("content-type") == "application/json" else {})

    async def shutdown(
        self,
        grace: float,
        during: Callable[[], Any] | None = None,
        after_cancel: Callable[[], object] | None = None,
    ) -> list[Answer]:
        """SIGTERM as uvicorn handles it, then what asyncio.run does with the tasks still left.

        `during` runs (as a task) while the requests are given their grace; `after_cancel` is
        called once the late requests are cancelled, right before the lifespan's shutdown (the
        engine's close) begins: a publisher that resumes then, or not."""
        helper = asyncio.create_task(_call(during)) if during is not None else None
        running = [t for t in self.requests if not t.done()]
        if running:
            _, late = await asyncio.wait(running, timeout=grace)
            for t in late:
                t.cancel()  # "Cancel N running task(s), timeout graceful shutdown exceeded"
        if after_cancel is not None:
            after_cancel()
        assert self._lifespan is not None
        await asyncio.wait_for(self._lifespan.__aexit__(None, None, None), WATCHDOG)
        for t in self.requests:
            if not t.done():
                t.cancel()  # asyncio.run cancels what is left once the server has returned
        if helper is not None:
            helper.cancel()
            await asyncio.gather(helper, return_exceptions=True)
        if self.requests:
            _, hung = await asyncio.wait(self.requests, timeout=WATCHDOG)
            assert not hung, f"{len(hung)} request(s) never returned"
        if self._client is not None:
            await self._client.aclose()
        return [t.result() for t in self.requests]


async def _call(during: Callable[[], Any]) -> None:
    result = during()
    if asyncio.iscoroutine(result):
        await result


async def stored_states(path: Path, route: str, keys: list[str]) -> dict[str, KeyState | None]:
    """Each key's state as a new process would read it from the store file."""
    store = SqliteStore(path)
    try:
        return {k: await store.read(route, k) for k in keys}
    finally:
        await store.close()
