"""Keep a lease alive while a publish is under way: publishes can retry for longer than a lease."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType

from pubsub_filter.core.config.schema import LeaseConfig
from pubsub_filter.core.logs import get_logger, trace_field
from pubsub_filter.core.model import KeyState
from pubsub_filter.core.ports import UNTRACED, Clock, StateStore, StoreUnavailable, Traced

log = get_logger("pubsub_filter.heartbeat")


@dataclass(eq=False)
class Heartbeat:
    """An async context manager: while open, extends the lease every `lease.heartbeat` seconds.

    `held` is always the latest state the store confirmed (its version moves with each
    extension, and the commit must present it). A beat that finds a newer fence stops:
    the lease was taken over and the commit will be refused.
    """

    store: StateStore
    route: str
    key: str
    held: KeyState
    lease: LeaseConfig
    clock: Clock
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    traced: Traced = UNTRACED  # the decision's: each beat is an event on its publish's span
    counts: Counter[str] = field(default_factory=Counter)  # the engine's (`Engine.counts`)
    trace: str | None = None  # the request's trace name: each line of the beat's carries it
    extended: int = field(default=0, init=False)
    failures: int = field(default=0, init=False)
    lost: bool = field(default=False, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    async def __aenter__(self) -> Heartbeat:
        self._task = asyncio.create_task(self._beat())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            current = asyncio.current_task()
            cancels = current.cancelling() if current is not None else 0
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                # The beat never raises into the publish it guards: by now the publish may have
                # landed, and only a commit attempt (refused if the lease moved) may follow it.
                # A cancel of ours that landed while the beat stopped is taken back, as
                # `cancels.despite_one_cancel` takes one back: left counted, it would make a
                # later `asyncio.timeout` in this task take its own expiry for someone else's cancel.
                if current is not None and current.cancelling() > cancels:
                    current.uncancel()

    async def _beat(self) -> None:
        fence = self.held.lease.fence if self.held.lease else None
        while True:
            await self.sleep(self.lease.heartbeat)
            try:
                extended = await self.store.extend(
                    self.route, self.key, self.held, self.clock.now() + self.lease.duration
                )
            except Exception as exc:  # any store error: keep beating, the lease may still be saved
                self.failures += 1
                self.counts["heartbeat_failed"] += 1
                self.traced.heartbeat("heartbeat failed", error=f"{type(exc).__name__}: {exc}")
                error = str(exc) if isinstance(exc, StoreUnavailable) else f"{type(exc).__name__}: {exc}"
                log.warning(
                    "heartbeat_failed",
                    route=self.route,
                    key=self.key,
                    fence=fence,
                    error=error,
                    **trace_field(self.trace),
                )
                continue
            self.traced.heartbeat("lease extended" if extended is not None else "lease lost")
            if extended is None:
                self.lost = True
                self.counts["lease_lost"] += 1
                log.warning("lease_lost", route=self.route, key=self.key, fence=fence, **trace_field(self.trace))
                return
            self.held = extended
            self.extended += 1
            log.debug("lease_extended", route=self.route, key=self.key, fence=fence, **trace_field(self.trace))
