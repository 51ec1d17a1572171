"""The engine end to end over each StateStore backend: decisions, cost per decision, racing processes.

The publisher and recorder are in-memory fakes of our own interfaces (tests/support/fakes.py);
the store is real: a SQLite file, or the Firestore emulator.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.core.attributes import ATTR_FINGERPRINT, ATTR_SOURCE_ID
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from tests.contract.conftest import OpenStore
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.polling import eventually

ROUTE = "reports"
KEY = "2025-01-10"
T0 = 1_767_225_600.0  # publish times: 2026-01-01T00:00:00Z onwards


def config(store_errors: dict[str, str] | None = None, **lease: str) -> Config:
    return parse(
        {
            "routes": [{"name": ROUTE, "destination": "phase3", "key": ["attributes.key"], "exclude": ["scraped"]}],
            "lease": lease or {"duration": "60s", "ack_deadline": "30s", "heartbeat": "10s"},
            # generous: these tests are about semantics, on a shared 2-core machine
            "store_errors": store_errors or {"timeout": "10s", "budget": "20s"},
        }
    )


def engine(store: Any, publisher: MemoryPublisher, cfg: Config | None = None, instance: str = "one") -> Engine:
    cfg = cfg or config()
    return Engine(cfg, GuardedStore(store, cfg.store_errors), publisher, MemoryRecorder(), instance=instance)


class Feed:
    """Messages with increasing ids and publish times, as a subscription would deliver them."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, content: Any, message_id: str | None = None, key: str = KEY, at: float | None = None) -> Message:
        self.n += 1
        body = {"game_date": key, "status": content, "scraped": f"09:{self.n:02d}"}
        return Message(
            data=json.dumps(body).encode(),
            attributes={"key": key},
            message_id=message_id or f"m{self.n}",
            publish_time=at if at is not None else T0 + self.n,
        )


# --- decisions ----------------------------------------------------------------------


async def test_forwarded_then_suppressed_then_changed_forwarded_then_redelivery_duplicate(store: Any) -> None:
    pub, feed = MemoryPublisher(), Feed()
    e = engine(store, pub)
    first = feed("out")
    assert (await e.handle(ROUTE, first)).record.decision is Decision.FORWARDED
    assert (await e.handle(ROUTE, feed("out"))).record.decision is Decision.SUPPRESSED  # only `scraped` moved
    changed = (await e.handle(ROUTE, feed("in"))).record
    assert (changed.decision, changed.reason) == (Decision.FORWARDED, "content changed")
    again = (await e.handle(ROUTE, first)).record  # Pub/Sub redelivers the first message
    assert again.decision is Decision.DUPLICATE
    assert [json.loads(d)["status"] for d in pub.data] == ["out", "in"]
    state = await store.read(ROUTE, KEY)
    assert state.fingerprint == changed.fingerprint and state.lease is None


async def test_a_then_b_then_a_forwards_all_three(store: Any) -> None:
    pub, feed = MemoryPublisher(), Feed()
    e = engine(store, pub)
    got = [(await e.handle(ROUTE, feed(s))).record.decision for s in ("out", "in", "out")]
    assert got == [Decision.FORWARDED] * 3
    assert [json.loads(d)["status"] for d in pub.data] == ["out", "in", "out"]
    state = await store.read(ROUTE, KEY)
    assert [mid for mid, _ in state.recent] == ["m1", "m2", "m3"]


async def test_failed_publish_releases_the_lease_and_the_redelivery_forwards(store: Any) -> None:
    pub, feed = MemoryPublisher(fail=True), Feed()
    e = engine(store, pub)
    msg = feed("out")
    rec = (await e.handle(ROUTE, msg)).record
    assert (rec.decision, rec.extra["cause"]) == (Decision.FAILED, "publish")
    state = await store.read(ROUTE, KEY)
    assert state.lease is None and state.fingerprint is None
    pub.fail = False
    assert (await e.handle(ROUTE, msg)).record.decision is Decision.FORWARDED
    assert len(pub.published) == 1


async def test_heartbeat_extends_a_slow_publish_and_the_commit_still_lands(store: Any) -> None:
    gate = asyncio.Event()
    pub, feed = MemoryPublisher(gate=gate), Feed()
    e = engine(
        store,
        pub,
        config(duration="5s", ack_deadline="4s", heartbeat="100ms", store_errors={"timeout": "3s", "budget": "3.5s"}),
    )
    slow = asyncio.create_task(e.handle(ROUTE, feed("out")))
    await pub.started.wait()
    # until two extensions (each moves the version) have returned: beats are sequential, the third
    # started after the second returned
    await eventually(lambda: store.ops["extend"] >= 3, 10, "the heartbeat never extended the lease")
    gate.set()
    rec = (await slow).record
    assert rec.decision is Decision.FORWARDED and rec.extra.get("heartbeats", 0) >= 2
    assert rec.extra.get("committed", True) is True
    state = await store.read(ROUTE, KEY)
    assert state.lease is None and state.fingerprint == rec.fingerprint


async def test_a_message_without_its_key_is_forwarded_each_time_without_touching_the_state(store: Any) -> None:
    pub, feed = MemoryPublisher(), Feed()
    e = engine(store, pub)
    keyed = feed("out")
    await e.handle(ROUTE, keyed)
    before = dict(store.ops)
    keyless = Message(data=keyed.data, attributes={}, message_id="nokey", publish_time=T0)  # `key` attribute gone
    first, again = (
        (await e.handle(ROUTE, keyless)).record,
        (await e.handle(ROUTE, keyless)).record,
    )  # and its redelivery
    assert dict(store.ops) == before, "a message without its key read or wrote the state"
    assert [(r.decision, r.key, r.fence) for r in (first, again)] == [(Decision.FAIL_OPEN, None, None)] * 2
    assert first.extra["missing_field"] == "attributes.key" and "attributes.key is missing" in (first.reason or "")
    # nothing recorded it, so its redelivery is forwarded again: the same source id tells them apart
    assert [p.attributes[ATTR_SOURCE_ID] for p in pub.published] == [keyed.message_id, "nokey", "nokey"]
    assert (await e.handle(ROUTE, feed("out"))).record.decision is Decision.SUPPRESSED  # the key's state is as it was
    state = await store.read(ROUTE, KEY)
    assert state.lease is None and state.message_id == keyed.message_id


# --- what a decision costs ------------------------------------------------------------


async def test_the_suppress_path_is_one_read_and_no_write(store: Any) -> None:
    pub, feed = MemoryPublisher(), Feed()
    e = engine(store, pub)
    await e.handle(ROUTE, feed("out"))
    store.ops.clear()
    assert (await e.handle(ROUTE, feed("out"))).record.decision is Decision.SUPPRESSED
    assert (store.ops["read"], store.ops["write"]) == (1, 0)


async def test_the_forward_path_is_one_read_one_claim_one_commit(store: Any) -> None:
    pub, feed = MemoryPublisher(), Feed()
    e = engine(store, pub)
    for status in ("out", "in"):  # a new key, then a changed one
        store.ops.clear()
        assert (await e.handle(ROUTE, feed(status))).record.decision is Decision.FORWARDED
        assert (store.ops["read"], store.ops["write"], store.ops["claim"], store.ops["commit"]) == (1, 2, 1, 1)
        assert store.ops["conflict"] == 0


# --- two processes --------------------------------------------------------------------


async def test_two_engines_with_different_content_for_one_key_do_not_both_publish(open_store: OpenStore) -> None:
    gate = asyncio.Event()
    pub, feed = MemoryPublisher(gate=gate, track="key"), Feed()
    one = engine(open_store(), pub, instance="one")
    two = engine(open_store(), pub, instance="two")
    first = asyncio.create_task(one.handle(ROUTE, feed("out")))
    await pub.started.wait()
    second = (await two.handle(ROUTE, feed("in"))).record  # while `one` is still publishing
    assert (second.decision, second.reason) == (Decision.CONTENDED, "other content for this key is in flight")
    assert pub.attempts == 1
    gate.set()
    assert (await first).record.decision is Decision.FORWARDED
    retried = (await two.handle(ROUTE, feed("in"))).record  # Pub/Sub redelivers after the 503
    assert retried.decision is Decision.FORWARDED
    assert [json.loads(d)["status"] for d in pub.data] == ["out", "in"]
    assert pub.max_in_flight_by[KEY] == 1


async def test_two_engines_racing_one_key_never_publish_at_the_same_time(open_store: OpenStore) -> None:
    pub, feed = MemoryPublisher(delay=0.01, track="key"), Feed()
    engines = [engine(open_store(), pub, instance="one"), engine(open_store(), pub, instance="two")]
    rounds = 12

    async def deliver(e: Engine, msg: Message) -> Decision:
        """Handle until acked, as Pub/Sub redelivers after a 503; the final decision."""

        async def acked() -> Decision | None:
            rec = (await e.handle(ROUTE, msg)).record
            return None if rec.decision is Decision.CONTENDED else rec.decision

        return await eventually(acked, 30, f"{msg.message_id} was contended for 30 s", poll=0.005)

    outcomes: list[Decision] = []
    for r in range(rounds):
        msgs = [feed(f"r{r}-one"), feed(f"r{r}-two")]
        outcomes += await asyncio.gather(*(deliver(e, m) for e, m in zip(engines, msgs, strict=True)))
    # The loser of a round is forwarded after the winner, or (if the winner was the newer
    # message) acked as stale: never published out of order, never at the same time.
    assert set(outcomes) <= {Decision.FORWARDED, Decision.STALE}
    assert outcomes.count(Decision.FORWARDED) == len(pub.published) >= rounds
    assert pub.max_in_flight_by[KEY] == 1, "two processes published for one key at the same time"
    times = [json.loads(d)["scraped"] for d in pub.data]
    assert times == sorted(times), "published out of order"
    state = await engines[0].store.read(ROUTE, KEY)
    assert state is not None and state.lease is None
    assert state.fingerprint == pub.published[-1].attributes[ATTR_FINGERPRINT]


# --- a message id reused with other content -------------------------------------------


async def test_a_message_id_reused_with_other_content_is_decided_as_that_content_and_says_so(store: Any) -> None:
    pub, feed = MemoryPublisher(), Feed()
    e = engine(store, pub)
    assert (await e.handle(ROUTE, feed("out", message_id="req-1"))).record.decision is Decision.FORWARDED
    changed = (await e.handle(ROUTE, feed("in", message_id="req-1"))).record  # a caller's request id, new content
    assert changed.decision is Decision.FORWARDED
    assert changed.reason == "content changed; the message id was reused with other content"
    assert changed.extra["id_reused"] is True
    assert [json.loads(d)["status"] for d in pub.data] == ["out", "in"]
    for status in ("in", "out"):  # either content again under that id: a redelivery of that forward
        again = (await e.handle(ROUTE, feed(status, message_id="req-1"))).record
        assert (again.decision, again.reason) == (Decision.DUPLICATE, "message already forwarded")
        assert "id_reused" not in again.extra
    assert len(pub.data) == 2


async def test_a_reused_id_whose_other_content_is_unchanged_is_suppressed_on_its_merits(store: Any) -> None:
    pub, feed = MemoryPublisher(), Feed()
    e = engine(store, pub)
    await e.handle(ROUTE, feed("out", message_id="a"))
    await e.handle(ROUTE, feed("in", message_id="b"))
    again = (await e.handle(ROUTE, feed("in", message_id="a"))).record  # id a, with what b forwarded last
    assert (again.decision, again.extra.get("id_reused")) == (Decision.SUPPRESSED, True)
    assert again.reason == "unchanged since last forward; the message id was reused with other content"
    assert len(pub.data) == 2
