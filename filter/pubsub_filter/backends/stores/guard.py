"""Bound every store call in time: a per-attempt timeout and brief retries, then `StoreUnavailable`.

Composed around any `StateStore`, so backends stay simple and the engine never hangs a
request past its deadline on the store: the whole budget stays well under the ack deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, retry_if_exception_type, stop_before_delay, wait_random_exponential

from pubsub_filter.core.config.schema import StoreErrors
from pubsub_filter.core.model import KeyState
from pubsub_filter.core.ports import StateStore, StoreUnavailable, Suspends

T = TypeVar("T")


class GuardedStore:
    """`inline=True` for a store whose calls never suspend (SQLite): a timeout could not fire.

    By default a store says so itself, with `suspends = False` (`ports.Suspends`; `SqliteStore` does).
    """

    def __init__(self, inner: StateStore, policy: StoreErrors, inline: bool | None = None):
        self.inner = inner
        self.policy = policy
        self.inline = (isinstance(inner, Suspends) and not inner.suspends) if inline is None else inline

    @property
    def suspends(self) -> bool:
        """As its store's calls (`ports.Suspends`): the engine then knows no cancel lands inside one."""
        return not self.inline

    async def _attempt(self, op: Callable[[], Awaitable[T]]) -> T:
        try:
            if self.inline:
                return await op()
            async with asyncio.timeout(self.policy.timeout):
                return await op()
        except StoreUnavailable:
            raise
        except TimeoutError:
            raise StoreUnavailable(f"no answer within {self.policy.timeout:g}s") from None
        except Exception as exc:
            # Whatever a backend raises (a corrupt SQLite page, a document it cannot decode,
            # a client bug) is the store failing to answer: the route's on_store_error
            # decides, and no store error escapes the engine as an exception.
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def _call(self, op: Callable[[], Awaitable[T]]) -> T:
        started = time.monotonic()
        try:
            return await self._attempt(op)  # the common case: no retry machinery on the hot path
        except StoreUnavailable:
            remaining = self.policy.budget - (time.monotonic() - started)
            if remaining <= 0:
                raise
        retrying = AsyncRetrying(
            stop=stop_before_delay(remaining),  # never sleep past the budget, only to give up after it
            wait=wait_random_exponential(multiplier=0.05, max=0.5),
            retry=retry_if_exception_type(StoreUnavailable),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._attempt(op)
        raise AssertionError("unreachable")  # pragma: no cover

    async def read(self, route: str, key: str) -> KeyState | None:
        return await self._call(lambda: self.inner.read(route, key))

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        return await self._call(lambda: self.inner.claim(route, key, seen, new))

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        return await self._call(lambda: self.inner.extend(route, key, held, expires_at))

    async def commit(self, route: str, key: str, held: KeyState, new: KeyState) -> bool:
        return await self._call(lambda: self.inner.commit(route, key, held, new))

    async def release(self, route: str, key: str, held: KeyState) -> None:
        await self._call(lambda: self.inner.release(route, key, held))

    async def ping(self) -> None:
        await self._call(self.inner.ping)

    async def close(self) -> None:
        await self.inner.close()
