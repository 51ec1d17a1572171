"""The store guard: a slow or failing store turns into StoreUnavailable within the budget, never a hang."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import StoreErrors
from pubsub_filter.core.model import KeyState
from pubsub_filter.core.ports import StoreUnavailable


class Flaky:
    def __init__(self, failures: int = 0, hang: bool = False):
        self.failures = failures
        self.hang = hang
        self.calls = 0

    async def read(self, route: str, key: str) -> KeyState | None:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        if self.calls <= self.failures:
            raise StoreUnavailable("blip")
        return KeyState(fingerprint="sha256:x")


async def test_a_passing_blip_is_retried_transparently() -> None:
    inner = Flaky(failures=2)
    guard = GuardedStore(inner, StoreErrors(timeout=1, budget=5))  # type: ignore[arg-type]
    assert (await guard.read("r", "k")) == KeyState(fingerprint="sha256:x")
    assert inner.calls == 3


async def test_a_store_that_keeps_failing_is_unavailable_after_the_budget() -> None:
    inner = Flaky(failures=10**6)
    guard = GuardedStore(inner, StoreErrors(timeout=1, budget=0.3))  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(StoreUnavailable):
        await guard.read("r", "k")
    assert loop.time() - started < 1.5  # bounded by the budget (plus one last wait), never open-ended
    assert inner.calls > 1


async def test_a_hanging_store_times_out_per_attempt() -> None:
    guard = GuardedStore(Flaky(hang=True), StoreErrors(timeout=0.05, budget=0.2))  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable, match=r"no answer within 0\.05s"):
        await guard.read("r", "k")


class Inline(Flaky):
    """A store that declares its calls never yield to the loop (this one lies, to show no timeout is set)."""

    suspends = False

    async def read(self, route: str, key: str) -> KeyState | None:
        await asyncio.sleep(0.1)  # the thing under test: a call longer than the guard's timeout
        return await super().read(route, key)


async def test_a_store_that_declares_it_never_suspends_is_called_without_a_timeout() -> None:
    guard = GuardedStore(Inline(), StoreErrors(timeout=0.01, budget=0.02))  # type: ignore[arg-type]
    assert (await guard.read("r", "k")) == KeyState(fingerprint="sha256:x")


async def test_the_embedded_store_is_guarded_without_a_timeout(tmp_path: Path) -> None:
    guard = GuardedStore(SqliteStore(tmp_path / "state.db"), StoreErrors())
    try:
        assert guard.inline
    finally:
        await guard.close()


def test_a_store_that_does_not_declare_it_is_guarded_with_a_timeout() -> None:
    assert not GuardedStore(Flaky(), StoreErrors()).inline  # type: ignore[arg-type]
