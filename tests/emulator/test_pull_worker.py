"""`pubsub-filter pull` against the Pub/Sub emulator: the same decisions as the push endpoint,
acks and nacks as push would answer, a clean exit 0 on SIGTERM with in-flight work finished.

The worker runs as a real subprocess (the console script), so SIGTERM is the real signal.
Its reference is the push app (httpx ASGI transport) on a fresh store, fed the very same
messages (ids, publish times, data, attributes) in the same order.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.api_core import exceptions as gexc

from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.model import ACKED
from pubsub_filter.pull.command import PullSetupError, select_routes
from pubsub_filter.push.app import create_app
from pubsub_filter.runtime.wiring import make_store
from tests.support.dlq import DeadLetterRig, PullProcess, peek
from tests.support.emulators import PubsubEmulator
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.payloads import injury_report
from tests.support.pubsub_helpers import DelayProxy, PubsubAdmin
from tests.support.serve import records, write_config

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(180)]

ROUTE = "injury"
LEASE = {"duration": "20s", "ack_deadline": "10s", "heartbeat": "2s"}
FINAL = {str(d) for d in ACKED}


def route(subscription: str, destination: str) -> dict[str, Any]:
    return {
        "name": ROUTE,
        "subscription": subscription,
        "destination": destination,
        "key": ["payload.game_date"],
        "rows": "payload.players",
        "row_key": ["player_lookup", "game_id"],
        "include": ["player_lookup", "team", "game_date", "game_id", "injury_status", "reason", "reason_category"],
        "on_missing_key": "reject",  # a message without its key is nacked, as push answers 400, and dead-lettered
    }


def report(game_date: str, seed: int = 1, changed: int = 0) -> bytes:
    rep = injury_report(4, seed=seed, game_date=game_date)
    for row in rep["players"][:changed]:
        row["injury_status"] = "available" if row["injury_status"] != "available" else "out"
    return json.dumps(rep).encode()


class World:
    def __init__(self, emu: PubsubEmulator, tmp_path: Path):
        self.emu = emu
        self.tmp_path = tmp_path
        self.admin = PubsubAdmin(emu)
        self.rig = DeadLetterRig.create(self.admin, retain_acked=True)
        self.dest = self.admin.topic("dest")
        self.dest_sub = self.rig.subscription(self.dest, "downstream")
        self.tap = self.rig.subscription(self.rig.source, "tap")  # sees every source message as published
        # A second route in the same process: betting lines keyed by an attribute.
        self.odds_topic = self.admin.topic("odds")
        self.odds_sub = self.rig.subscription(self.odds_topic, "odds-sub")
        self.odds_dest = self.admin.topic("odds-dest")
        self.odds_dest_sub = self.rig.subscription(self.odds_dest, "odds-downstream")
        self.procs: list[PullProcess] = []

    def config(self, name: str = "pull", **top: Any) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "project": self.emu.project,
            "store": {"backend": "sqlite", "path": str(self.tmp_path / f"{name}-state.db")},
            "publisher": {"backend": "pubsub", "timeout": "20s"},
            "records": {"backend": "sqlite", "path": str(self.tmp_path / f"{name}-decisions.db")},
            "lease": dict(LEASE),
            "server": {"shutdown_budget": "15s"},
            "routes": [
                route(self.rig.sub, self.dest),
                {
                    "name": "odds",
                    "subscription": self.odds_sub,
                    "destination": self.odds_dest,
                    "key": ["attributes.line"],
                },
            ],
        }
        cfg.update(top)
        return cfg

    def start(
        self, name: str = "pull", pubsub_host: str | None = None, log_level: str = "info", **top: Any
    ) -> PullProcess:
        path = write_config(self.tmp_path / f"{name}.yaml", self.config(name, **top))
        proc = PullProcess(
            path,
            self.tmp_path / f"{name}.log",
            env={
                "PUBSUB_EMULATOR_HOST": pubsub_host or self.emu.host,
                "GOOGLE_CLOUD_PROJECT": self.emu.project,
                "LOG_LEVEL": log_level,
            },
            name=name,
        )
        self.procs.append(proc)
        return proc.start()

    def publish(self, data: bytes, **attributes: str) -> str:
        return self.admin.publish(self.rig.source, data, **attributes)

    def close(self) -> None:
        errors: list[BaseException] = []
        for proc in self.procs:
            try:
                if proc.proc is not None:
                    proc.stop()
            except BaseException as exc:
                errors.append(exc)
                proc.kill()
        self.rig.cleanup()
        self.admin.cleanup()
        if errors:
            raise errors[0]


@pytest.fixture
def world(pubsub_emulator: PubsubEmulator, tmp_path: Path) -> Iterator[World]:
    with closing(World(pubsub_emulator, tmp_path)) as w:
        yield w


def decisions_for(proc: PullProcess, message_id: str) -> list[dict[str, Any]]:
    return [d for d in proc.decisions() if d["message_id"] == message_id]


def wait_final(proc: PullProcess, message_id: str, count: int = 1) -> list[dict[str, Any]]:
    proc.wait_decisions(lambda ds: sum(d["message_id"] == message_id and d["decision"] in FINAL for d in ds) >= count)
    return decisions_for(proc, message_id)


async def push_reference(cfg: dict[str, Any], envelopes: list[bytes]) -> list[dict[str, Any]]:
    """The push endpoint's answers for the same stream, on a fresh store."""
    config = parse(cfg)
    engine = Engine(config, make_store(config), MemoryPublisher(), MemoryRecorder())
    answers = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(engine)), base_url="http://f") as c:
        for body in envelopes:
            resp = await c.post(f"/push/{ROUTE}", content=body, headers={"content-type": "application/json"})
            answers.append({"status": resp.status_code, **resp.json()})
    await engine.store.close()
    return answers


def test_pull_decides_a_mixed_stream_like_push(world: World) -> None:
    proc = world.start()
    ids: list[str] = []

    # Malformed first: not JSON, and JSON without the key. Push answers 400 (redelivered,
    # then dead-lettered); pull nacks the same way: never an ack of what was not understood.
    bad = [world.publish(b"not json at all", source="nbac"), world.publish(b'{"players": []}', source="nbac")]
    proc.wait_decisions(lambda ds: all(sum(d["message_id"] == b for d in ds) >= 5 for b in bad))
    ids += bad

    stream = [
        ("new", report("2026-01-10", seed=1)),
        ("unchanged", report("2026-01-10", seed=2)),  # a scraper rerun: only scrape metadata differs
        ("changed", report("2026-01-10", seed=3, changed=1)),
        ("other key", report("2026-01-11", seed=1)),
        ("back to the first", report("2026-01-10", seed=4)),  # A→B→A forwards all three
    ]
    for _, data in stream:
        mid = world.publish(data, source="nbac")
        wait_final(proc, mid)
        ids.append(mid)
    m1, m2, m3, m4, m5 = ids[2:]

    # Redelivery of messages already decided, with their own ids: seek the subscription back
    # to just before m2 (it retains acked messages).
    tapped = peek(world.admin, world.tap, len(ids))
    by_id = {t.message_id: t for t in tapped}
    assert set(by_id) == set(ids)
    from pubsub_filter.core.times import parse_time

    seek_to = parse_time(by_id[m2].publish_time) - 0.0005
    world.admin.subscriber.seek(
        request={
            "subscription": world.admin.subscription_path(world.rig.sub),
            "time": {"seconds": int(seek_to), "nanos": int(seek_to % 1 * 1e9)},
        }
    )
    redelivered = [m2, m3, m4, m5]
    for mid in redelivered:
        wait_final(proc, mid, count=2)

    # The second route, pulled by the same process.
    line = world.admin.publish(world.odds_topic, b'{"spread": -3.5}', line="LAL-BOS")
    assert [d["decision"] for d in wait_final(proc, line)] == ["forwarded"]
    [odds] = world.admin.pull(world.odds_dest_sub, 1, timeout=20)
    assert (odds.attributes["filter_route"], odds.attributes["line"]) == ("odds", "LAL-BOS")

    # Downstream: each forward exactly once; the redeliveries published nothing.
    got = world.admin.pull(world.dest_sub, 4, timeout=20)
    assert sorted(m.attributes["filter_source_message_id"] for m in got) == sorted([m1, m3, m4, m5])
    world.admin.assert_nothing_more(world.dest_sub, 1.0)
    # The malformed ones went to the dead-letter topic after 5 nacked deliveries.
    dead = world.rig.peek_dead_letters(2)
    assert sorted(d.data for d in dead) == sorted([b"not json at all", b'{"players": []}'])
    assert {d.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] for d in dead} == {"5"}

    proc.stop()  # SIGTERM: exit 0
    logged = proc.decisions()

    # The push endpoint, fed the same stream in the same order, decides the same.
    order = [*ids, *redelivered]
    envelopes = [
        make_envelope(
            by_id[mid].data,
            mid,
            by_id[mid].attributes,
            subscription=world.admin.subscription_path(world.rig.sub),
            publish_time=by_id[mid].publish_time,
        )
        for mid in order
    ]
    cfg = world.config("reference")
    answers = asyncio.run(push_reference(cfg, envelopes))
    assert [a["decision"] for a in answers] == [
        "rejected", "rejected",
        "forwarded", "suppressed", "forwarded", "forwarded", "forwarded",
        "suppressed", "duplicate", "duplicate", "duplicate",
    ]  # fmt: skip

    def collapse(ds: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        for d in ds:
            row = (d["decision"], d.get("reason"), d.get("fingerprint"), d.get("key"))
            if not out or out[-1] != row or d["decision"] != "rejected":  # 5 nacked deliveries = 1 answer
                out.append(row)
        return out

    pulled: list[tuple[Any, ...]] = []
    seen: dict[str, int] = {}
    for mid in order:
        rows = collapse([d for d in logged if d["message_id"] == mid])
        pulled.append(rows[seen.get(mid, 0)])
        seen[mid] = seen.get(mid, 0) + 1
    pushed = [(a["decision"], a.get("reason"), a.get("fingerprint"), a.get("key")) for a in answers]
    assert pulled == pushed
    # Acked exactly when push answered 2xx.
    for a, mid in zip(answers, order, strict=True):
        assert (a["status"] < 300) == (a["decision"] in FINAL), (mid, a)

    # Decision records were flushed before the exit: one row per logged decision.
    logged = [d for d in logged if d["route"] == ROUTE]
    rows = [r for r in records(world.tmp_path / "pull-decisions.db") if r["route"] == ROUTE]
    assert len(rows) == len(logged)
    assert {r["delivery_attempt"] for r in rows if r["message_id"] in bad} == {1, 2, 3, 4, 5}


def test_pull_forwards_a_message_without_its_key_fail_open_and_acks_it(world: World) -> None:
    proc = world.start()
    mid = world.admin.publish(world.odds_topic, b'{"spread": -3.5}', book="x")  # no `line`: the route's key
    [decided] = wait_final(proc, mid)
    assert (decided["decision"], decided["missing_field"]) == ("fail_open", "attributes.line")
    assert decided["reason"].startswith("key field attributes.line is missing: forwarded without a dedup decision")
    [got] = world.admin.pull(world.odds_dest_sub, 1, timeout=20)
    assert (got.data, got.attributes["filter_source_message_id"], got.attributes["book"]) == (
        b'{"spread": -3.5}',
        mid,
        "x",
    )
    assert "filter_fence" not in got.attributes and "filter_key" not in got.attributes  # no lease, no key
    proc.stop()
    stopped = next(e for e in proc.events() if e.get("message") == "stopped")
    assert (stopped["acked"], stopped["nacked"]) == (1, 0)


def test_sigterm_finishes_the_message_in_flight_then_exits_0(world: World, pubsub_emulator: PubsubEmulator) -> None:
    # Every byte to Pub/Sub is held 1.5 s: the publish downstream is in flight when SIGTERM lands.
    with DelayProxy(pubsub_emulator.host, delay=1.5) as proxy:
        proc = world.start(pubsub_host=proxy.host, log_level="debug")
        mid = world.publish(report("2026-02-01"), source="nbac")
        proc.wait_events(lambda es: any(e.get("message") == "lease_acquired" for e in es))
        started = time.monotonic()
        proc.stop()
        took = time.monotonic() - started
    events = proc.events()
    [decision] = [e for e in events if e.get("message") == "decision"]
    assert decision["message_id"] == mid and decision["decision"] == "forwarded"
    messages = [e.get("message") for e in events]
    assert messages.index("shutting_down") < messages.index("draining") < messages.index("decision")
    assert not {"in_flight_past_drain", "cancelling_decisions"} & set(messages)
    stopped = next(e for e in events if e.get("message") == "stopped")
    assert (stopped["acked"], stopped["nacked"]) == (1, 0)
    assert took < 15, f"shutdown took {took:.1f}s"
    [got] = world.admin.pull(world.dest_sub, 1, timeout=20)
    assert got.attributes["filter_source_message_id"] == mid
    # The ack went out after the stream was cancelled: the message is not redelivered once
    # its ack deadline (10 s) has passed.
    path = world.admin.subscription_path(world.rig.sub)
    deadline = time.monotonic() + 13
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            resp = world.admin.subscriber.pull(
                request={"subscription": path, "max_messages": 10}, timeout=max(remaining, 0.5), retry=None
            )
        except gexc.DeadlineExceeded:
            continue
        assert not resp.received_messages, "the message acked during shutdown was redelivered"


def test_pull_needs_a_subscription_per_route() -> None:
    cfg = parse(
        {
            "routes": [
                {"name": "a", "subscription": "a-sub", "destination": "out-a", "key": ["payload.k"]},
                {"name": "b", "destination": "out-b", "key": ["payload.k"]},
            ]
        }
    )
    with pytest.raises(PullSetupError, match=r"route\(s\) 'b' have no `subscription`"):
        select_routes(cfg, None)
    assert [r.name for r in select_routes(cfg, ["a"])] == ["a"]
    with pytest.raises(PullSetupError, match="no route 'c'"):
        select_routes(cfg, ["c"])


def test_a_subscription_that_does_not_exist_stops_the_worker_with_exit_1(world: World) -> None:
    path = write_config(
        world.tmp_path / "missing.yaml",
        {**world.config("missing"), "routes": [route("no-such-subscription", world.dest)]},
    )
    proc = PullProcess(
        path,
        world.tmp_path / "missing.log",
        env={"PUBSUB_EMULATOR_HOST": world.emu.host, "GOOGLE_CLOUD_PROJECT": world.emu.project},
        name="missing",
    )
    world.procs.append(proc)  # stopped by the fixture if it does not exit by itself
    proc.start()
    assert proc.proc is not None
    code = proc.proc.wait(30)
    proc.proc = None
    assert code == 1, proc.tail()
    [failed] = [e for e in proc.events() if e.get("message") == "pull_failed"]
    assert failed["route"] == ROUTE and "NotFound" in failed["error"]


def test_sigterm_while_messages_stream_in_logs_nothing_after_stopped(
    world: World, pubsub_emulator: PubsubEmulator
) -> None:
    """The library's stream threads end, and its channel closes, before the worker says `stopped`.

    Messages keep arriving and every request to Pub/Sub is held 3 s, so when SIGTERM lands
    the stream's thread is inside the receipt modack of a response: it outlives the
    library's own 1 s join of it, and must not find its channel closed under it.
    """
    done = threading.Event()

    def feed() -> None:
        day = 0
        while not done.is_set():
            day += 1
            world.publish(report(f"2026-03-{day % 28 + 1:02d}", seed=day), source="nbac")
            done.wait(0.05)

    with DelayProxy(pubsub_emulator.host, delay=3.0) as proxy:
        # Forwards go to a local outbox: nothing in flight holds the shutdown up past the modack.
        outbox = {"backend": "outbox", "path": str(world.tmp_path / "outbox.jsonl")}
        proc = world.start(pubsub_host=proxy.host, publisher=outbox)
        feeder = threading.Thread(target=feed, name="feed")
        feeder.start()
        try:
            proc.wait_decisions(lambda ds: len(ds) >= 5, timeout=60)
            proc.stop()
        finally:
            done.set()
            feeder.join()
    lines = proc.log_path.read_text().splitlines()
    stopped = next(i for i, line in enumerate(lines) if '"message":"stopped"' in line)
    assert lines[stopped + 1 :] == [], "\n".join(lines[stopped - 3 :])
    noise = ("Background thread did not exit", "Channel closed", "Traceback", "stream_threads_did_not_stop")
    assert not [line for line in lines if any(n in line for n in noise)], "\n".join(lines[stopped - 5 :])
