"""A state file someone else holds locked (another instance sharing it, an `sqlite3` shell in
`BEGIN IMMEDIATE`, a backup) holds up neither the event loop nor `/healthz`: a store call
that finds the file locked waits for it on the store's own thread, and goes on once the
lock is gone. Nothing is lost; a lock held past `busy_timeout` is the store unavailable."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from pubsub_filter.backends.publishers.outbox import read_outbox
from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.backends.stores.sqlite_connection import Connection, connect
from pubsub_filter.core.config.schema import load
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.model import KeyState, Lease
from pubsub_filter.core.ports import StoreUnavailable
from pubsub_filter.push.app import create_app
from pubsub_filter.runtime.wiring import make_engine
from tests.support.asgi import call

ROOT = Path(__file__).resolve().parents[2]
REPORT = json.loads((ROOT / "examples" / "injury-report.json").read_bytes())
PROMPT = 0.1  # seconds: what "at once" means for an answer here


@contextmanager
def write_locked(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the file's write lock until it rolls back (or the block ends)."""
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        yield holder
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()


async def reached_a_write(store: SqliteStore) -> None:
    """Until a request's write (its claim, or the purge a claim runs first) was tried."""
    deadline = time.monotonic() + 10
    while not (store.ops["claim"] or store.ops["purge"]):
        assert time.monotonic() < deadline, "no write was tried within 10 s"
        await asyncio.sleep(0)


async def test_a_locked_state_file_holds_up_neither_healthz_nor_a_push_that_goes_on_once_it_is_free(
    quick_start: Path,
) -> None:
    config = load(str(quick_start))
    engine = make_engine(config)
    app = create_app(engine)
    guarded = engine.store
    assert isinstance(guarded, GuardedStore) and isinstance(guarded.inner, SqliteStore)
    store = guarded.inner
    try:
        body = make_envelope(json.dumps({**REPORT, "game_date": "2025-03-01"}).encode(), "m1")
        with write_locked(Path(store.path)) as holder:
            push = asyncio.create_task(call(app, "POST", "/push/injury-report", body))
            await reached_a_write(store)
            assert not push.done(), "the push cannot have claimed its key under another connection's lock"
            started = time.perf_counter()
            health, _ = await call(app, "GET", "/healthz")
            took = time.perf_counter() - started
            assert health == 200 and took < PROMPT, took
            assert not push.done()
            holder.execute("ROLLBACK")
            status, _ = await asyncio.wait_for(push, 10)
        assert status == 200
        state = await store.read("injury-report", "2025-03-01")
        assert state is not None and state.message_id is not None and state.lease is None
        published = read_outbox(config.publisher.path).messages
        assert [m["attributes"]["filter_source_message_id"] for m in published] == ["m1"]  # type: ignore[index]
    finally:
        await engine.close()


async def test_calls_that_find_the_file_locked_wait_off_the_loop_and_all_go_on_once_it_is_free(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "state.db")
    try:
        first = await store.claim("r", "a", None, KeyState(fingerprint="sha256:a", fence=1))
        assert first is not None
        with write_locked(tmp_path / "state.db") as holder:
            claims = [
                asyncio.create_task(store.claim("r", f"k{n}", None, KeyState(fingerprint=f"sha256:{n}", fence=1)))
                for n in range(5)
            ]
            reads = [asyncio.create_task(store.read("r", "a")) for _ in range(3)]
            for _ in range(5):
                await asyncio.sleep(0)
            assert not any(c.done() for c in claims), "no claim can be written under another connection's lock"
            await store.ping()  # /readyz answers meanwhile
            holder.execute("ROLLBACK")
            claimed = await asyncio.wait_for(asyncio.gather(*claims), 10)
            read = await asyncio.wait_for(asyncio.gather(*reads), 10)
        assert all(c is not None for c in claimed)
        assert read == [first] * 3
        for n in range(5):
            assert await store.read("r", f"k{n}") == claimed[n]
    finally:
        await store.close()


async def tried_on_the_thread(store: SqliteStore, kind: str) -> None:
    """Until a `kind` call (claim, commit) found the file locked on the loop and was made again on
    the writer's thread, where it now waits for the lock (each attempt counts once in `ops`)."""
    deadline = time.monotonic() + 10
    while store.ops[kind] < 2:
        assert time.monotonic() < deadline, f"no {kind} was tried on the store's thread within 10 s"
        await asyncio.sleep(0)


@pytest.mark.parametrize("kind", ["claim", "commit"])
async def test_a_read_answers_while_a_write_waits_for_another_connections_lock(tmp_path: Path, kind: str) -> None:
    """WAL lets a reader in beside another connection's write lock: a read must not queue behind
    this store's own write that waits for that lock (it would wait up to `busy_timeout`)."""
    store = SqliteStore(tmp_path / "state.db", busy_timeout=3.0)
    try:
        lease = Lease("holder", 1, time.time() + 60, "sha256:a", "m1")
        held = await store.claim("r", "k", None, KeyState(fence=1, lease=lease))
        assert held is not None
        committed = replace(held, fingerprint="sha256:a", message_id="m1", lease=None)
        with write_locked(tmp_path / "state.db") as holder:
            write = asyncio.create_task(
                store.claim("r", "other", None, KeyState(fingerprint="sha256:b", fence=1))
                if kind == "claim"
                else store.commit("r", "k", held, committed)
            )
            await tried_on_the_thread(store, kind)
            read = asyncio.create_task(store.read("r", "k"))
            done, _ = await asyncio.wait({read, write}, return_when=asyncio.FIRST_COMPLETED)
            assert done == {read}, f"the read waited behind the {kind}: {done}"
            assert read.result() == held
            holder.execute("ROLLBACK")
            assert await asyncio.wait_for(write, 10)  # the write goes on once the lock is free
        assert (await store.read("r", "k" if kind == "commit" else "other")) is not None
    finally:
        await store.close()


async def test_a_lock_held_past_the_busy_timeout_is_the_store_unavailable_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "state.db", busy_timeout=0.3)
    try:
        with write_locked(tmp_path / "state.db"):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="locked"):
                await store.claim("r", "k", None, KeyState(fingerprint="sha256:a", fence=1))
            assert time.monotonic() - started >= 0.25  # it waited for the lock, on the thread
        assert await store.read("r", "k") is None  # nothing half-written
        assert await store.claim("r", "k", None, KeyState(fingerprint="sha256:a", fence=1)) is not None
    finally:
        await store.close()


async def test_a_connection_that_finds_the_file_locked_even_for_reading_waits_on_its_own_thread(
    tmp_path: Path,
) -> None:
    """The reader's way when the file is locked against readers too (a rollback-journal file under
    another connection's exclusive lock): its statement waits on the connection's thread, the
    loop goes on, and the call answers once the lock is gone."""
    path = tmp_path / "plain.db"
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("CREATE TABLE t (x)")
    setup.execute("INSERT INTO t VALUES (1)")
    setup.close()
    reader = Connection(connect(str(path), 5.0), str(path), 5.0, "reader")
    try:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        read = asyncio.create_task(reader.run(lambda: reader.exec("SELECT x FROM t").fetchall()))
        loop_turns = asyncio.Event()
        asyncio.get_running_loop().call_soon(loop_turns.set)
        await loop_turns.wait()  # the loop runs while the read waits
        assert not read.done()
        holder.execute("ROLLBACK")
        holder.close()
        assert await asyncio.wait_for(read, 10) == [(1,)]
    finally:
        await reader.close()
