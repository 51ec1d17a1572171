"""`pubsub-filter replay` against the Pub/Sub emulator.

Messages are dead-lettered for real: a pull subscription with a dead-letter policy (5
attempts) whose consumer nacks them (the failing route). Then the route is "fixed" and
the dead letters are replayed by the console script, as an operator would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.envelope import ATTR_ORIGINAL_TIME
from pubsub_filter.core.times import parse_time
from pubsub_filter.replay.deadletter import ATTR_COUNT, ATTR_ORIGINAL_ID
from tests.support.dlq import DeadLetterRig, ReplayProcess, counted, run_replay
from tests.support.emulators import PubsubEmulator
from tests.support.payloads import injury_report
from tests.support.pubsub_helpers import PubsubAdmin, Pulled, emulator_env
from tests.support.serve import records, write_config

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(240)]


@pytest.fixture
def background(env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    """Start `pubsub-filter replay` in the background; every one started is killed at teardown."""
    started: list[ReplayProcess] = []

    def start(*args: str) -> ReplayProcess:
        proc = ReplayProcess(list(args), env, tmp_path)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def env(pubsub_emulator: PubsubEmulator) -> dict[str, str]:
    return {"PUBSUB_EMULATOR_HOST": pubsub_emulator.host, "GOOGLE_CLOUD_PROJECT": pubsub_emulator.project}


def received(admin: PubsubAdmin, sub: str, count: int, timeout: float = 20.0) -> list[Pulled]:
    """What the (now fixed) consumer of the source subscription gets: exactly `count`, then nothing."""
    got = admin.pull(sub, count, timeout)
    assert len(got) == count, f"expected {count} messages on {sub}, got {len(got)}"
    admin.assert_nothing_more(sub, 1.0)
    return got


def publish_batch(admin: PubsubAdmin, topic: str, n: int, start: int = 0, **attrs: str) -> list[str]:
    return [
        admin.publish(topic, json.dumps({"n": i, "game_date": f"2026-01-{i + 1:02d}"}).encode(), n=str(i), **attrs)
        for i in range(start, start + n)
    ]


# --- republish to the source topic -------------------------------------------------------------


def test_replay_after_the_fix_delivers_each_message_once_with_its_attributes(
    admin: PubsubAdmin, rig: DeadLetterRig, env: dict[str, str]
) -> None:
    ids = publish_batch(admin, rig.source, 4, source="nbac")
    ids.append(admin.publish(rig.source, b"\x00raw bytes\xff", ordering_key="game-7", source="nbac", kind="raw"))
    rig.dead_letter(ids)
    dead = {d.data: d for d in rig.peek_dead_letters(len(ids))}

    result = run_replay([rig.dlq_sub, "--wait", "1"], env)

    assert result.code == 0, result
    assert counted(result, "replayed") == 5
    assert counted(result, "failed") == 0
    got = received(admin, rig.sub, 5)
    assert len({m.message_id for m in got}) == 5
    for m in got:
        d = dead[m.data]
        original = {k: v for k, v in d.attributes.items() if not k.startswith("CloudPubSubDeadLetter")}
        assert m.attributes == {
            **original,
            ATTR_ORIGINAL_ID: d.message_id,
            ATTR_ORIGINAL_TIME: d.attributes["CloudPubSubDeadLetterSourceTopicPublishTime"],
            ATTR_COUNT: "1",
        }
        assert m.ordering_key == d.ordering_key
        # The original publish time is the source message's, before it was dead-lettered.
        assert parse_time(m.attributes[ATTR_ORIGINAL_TIME]) <= parse_time(d.publish_time)
    assert [m.ordering_key for m in got if m.data.startswith(b"\x00")] == ["game-7"]

    again = run_replay([rig.dlq_sub, "--wait", "1"], env)  # the dead-letter subscription is empty now
    assert again.code == 0, again
    assert counted(again, "replayed") == 0
    admin.assert_nothing_more(rig.sub, 0.5)


def test_a_dead_letter_at_pubsubs_attribute_limit_is_replayed_within_it_or_left_in_place(
    admin: PubsubAdmin, rig: DeadLetterRig, env: dict[str, str]
) -> None:
    """Pub/Sub takes 100 attributes and dead-lettering adds 4 past that. The replay drops those 4
    and adds its own while there is room, the original publish time first (the stale guard's);
    a message whose own 100 leave no room for it stays in the dead-letter subscription, counted."""
    ids = {
        own: admin.publish(rig.source, f"own {own}".encode(), **{f"a{i:03d}": "v" for i in range(own)})
        for own in (97, 98, 99, 100)
    }
    rig.dead_letter(list(ids.values()))
    dead = {d.data: d for d in rig.peek_dead_letters(len(ids))}
    assert sorted(len(d.attributes) for d in dead.values()) == [101, 102, 103, 104]  # 4 added past 100

    listed = run_replay([rig.dlq_sub, "--wait", "1", "--dry-run"], env)
    assert listed.code == 0, listed
    [line] = [x for x in listed.stdout.splitlines() if x.startswith(f"would replay {dead[b'own 100'].message_id} ")]
    assert "(cannot be replayed: it has 100 attributes of its own" in line
    assert "104 attributes as dead-lettered" in line

    result = run_replay([rig.dlq_sub, "--wait", "1"], env)

    assert result.code == 1, result  # one left failed
    assert counted(result, "replayed") == 3
    assert counted(result, "failed") == 1
    assert (
        "1 x it has 100 attributes of its own, Pub/Sub's limit, and a replay must add "
        "filter_replay_original_publish_time: left in the dead-letter subscription"
    ) in result.stdout
    got = {m.data: m for m in received(admin, rig.sub, 3)}
    expected_ours = {  # the replay's own attributes each one had room for
        b"own 97": {ATTR_ORIGINAL_TIME, ATTR_ORIGINAL_ID, ATTR_COUNT},
        b"own 98": {ATTR_ORIGINAL_TIME, ATTR_ORIGINAL_ID},
        b"own 99": {ATTR_ORIGINAL_TIME},
    }
    for data, ours in expected_ours.items():
        m, d = got[data], dead[data]
        assert len(m.attributes) == 100
        own = {k: v for k, v in d.attributes.items() if not k.startswith("CloudPubSubDeadLetter")}
        assert {k: v for k, v in m.attributes.items() if k in own} == own  # every one of its own kept
        assert set(m.attributes) - set(own) == ours
        assert m.attributes[ATTR_ORIGINAL_TIME] == d.attributes["CloudPubSubDeadLetterSourceTopicPublishTime"]
    [left] = rig.peek_dead_letters(1)  # never acked unrepublished
    assert left.data == b"own 100"


def test_interrupted_replays_resume_without_loss(
    admin: PubsubAdmin, rig: DeadLetterRig, env: dict[str, str], background: Any
) -> None:
    ids = publish_batch(admin, rig.source, 8)
    rig.dead_letter(ids)
    seen: list[Pulled] = []

    # 1. --max smaller than the backlog: two now, the rest left for later.
    result = run_replay([rig.dlq_sub, "--wait", "1", "--max", "2"], env)
    assert result.code == 0, result
    assert counted(result, "replayed") == 2
    seen += received(admin, rig.sub, 2)

    # 2. Ctrl-C while replaying at 2 msg/s: what is under way finishes, the rest is released at once.
    proc = background(rig.dlq_sub, "--wait", "1", "--rate", "2/s")
    seen += admin.pull(rig.sub, 1, timeout=20)
    proc.signal(signal.SIGINT)
    interrupted = proc.wait()
    assert interrupted.code == 130, interrupted
    assert "(interrupted)" in interrupted.stdout
    seen += admin.drain(rig.sub, 1.0)
    done = counted(interrupted, "replayed")
    assert len(seen) == 2 + done

    # 3. A crash (SIGKILL): nothing is released; the messages it held come back after the
    # dead-letter subscription's ack deadline (10 s), and a rerun carries on.
    proc = background(rig.dlq_sub, "--wait", "1", "--rate", "2/s")
    seen += admin.pull(rig.sub, 1, timeout=20)
    proc.kill()
    deadline = time.monotonic() + 60
    while len({m.attributes[ATTR_ORIGINAL_ID] for m in seen}) < len(ids):
        assert time.monotonic() < deadline, f"replays never caught up: {len(seen)} of {len(ids)}"
        rerun = run_replay([rig.dlq_sub, "--wait", "2"], env)
        assert rerun.code == 0, rerun
        seen += admin.drain(rig.sub, 0.5)

    originals = Counter(m.attributes[ATTR_ORIGINAL_ID] for m in seen)
    assert len(originals) == len(ids), "a dead-lettered message was lost"
    # At-least-once: only what was confirmed in the last ack interval (0.5 s, one or two
    # messages at 2/s) before the SIGKILL may come twice.
    assert sum(originals.values()) - len(ids) <= 2, originals
    assert sorted({json.loads(m.data)["n"] for m in seen}) == list(range(8))
    final = run_replay([rig.dlq_sub, "--wait", "1"], env)
    assert counted(final, "replayed") == 0, final


def test_dry_run_where_since_until(admin: PubsubAdmin, rig: DeadLetterRig, env: dict[str, str]) -> None:
    early = publish_batch(admin, rig.source, 3, source="a")
    late = publish_batch(admin, rig.source, 3, start=3, source="b")
    rig.dead_letter(early + late)
    by_n = {int(d.attributes["n"]): d for d in rig.peek_dead_letters(6)}

    # Dry run: lists all six, acks nothing, publishes nothing.
    dry = run_replay([rig.dlq_sub, "--wait", "1", "--dry-run"], env)
    assert dry.code == 0, dry
    listed = [line for line in dry.stdout.splitlines() if line.startswith("would replay ")]
    assert sorted(line.split()[2] for line in listed) == sorted(d.message_id for d in by_n.values())
    assert all(f"to projects/{admin.project}/topics/{rig.source}" in line for line in listed)
    assert counted(dry, "would be replayed") == 6
    admin.assert_nothing_more(rig.sub, 1.0)
    assert len(rig.peek_dead_letters(6)) == 6

    # --where: attributes and payload, = and !=, all must hold.
    where = run_replay(
        [rig.dlq_sub, "--wait", "1", "--where", "attributes.source=a", "--where", "payload.game_date!=2026-01-02"], env
    )
    assert where.code == 0, where
    assert (counted(where, "replayed"), counted(where, "filtered out")) == (2, 4)
    assert sorted(json.loads(m.data)["n"] for m in received(admin, rig.sub, 2)) == [0, 2]

    # --until 24h: only what was first published more than a day ago (nothing here).
    until = run_replay([rig.dlq_sub, "--wait", "1", "--until", "24h"], env)
    assert (counted(until, "replayed"), counted(until, "filtered out")) == (0, 4)

    # --since an RFC 3339 time: the later batch, by its original publish time.
    since = by_n[3].attributes["CloudPubSubDeadLetterSourceTopicPublishTime"]
    newer = run_replay([rig.dlq_sub, "--wait", "1", "--since", since, "--where", "payload.n!=4"], env)
    assert newer.code == 0, newer
    assert (counted(newer, "replayed"), counted(newer, "filtered out")) == (2, 2)
    assert sorted(json.loads(m.data)["n"] for m in received(admin, rig.sub, 2)) == [3, 5]

    rest = run_replay([rig.dlq_sub, "--wait", "1", "--since", "1h"], env)
    assert counted(rest, "replayed") == 2, rest
    assert sorted(json.loads(m.data)["n"] for m in received(admin, rig.sub, 2)) == [1, 4]


def test_a_message_whose_source_is_gone_fails_and_stays_then_goes_with_to(
    admin: PubsubAdmin, rig: DeadLetterRig, env: dict[str, str]
) -> None:
    ids = publish_batch(admin, rig.source, 2)
    rig.dead_letter(ids)
    admin.delete_subscription(rig.sub)  # the source subscription is gone: its topic cannot be looked up

    result = run_replay([rig.dlq_sub, "--wait", "1"], env)
    assert result.code == 1, result
    assert (counted(result, "replayed"), counted(result, "failed")) == (0, 2)
    assert "no longer exists: pass --to TOPIC" in result.stdout
    assert len(rig.peek_dead_letters(2)) == 2  # still there

    elsewhere = admin.topic("elsewhere")
    elsewhere_sub = rig.subscription(elsewhere)
    result = run_replay([rig.dlq_sub, "--wait", "1", "--to", elsewhere], env)
    assert result.code == 0, result
    assert sorted(json.loads(m.data)["n"] for m in received(admin, elsewhere_sub, 2)) == [0, 1]


# --- through the filter ------------------------------------------------------------------------------


ROUTE = "injury"


def report(game_date: str, seed: int = 1, changed: int = 0) -> bytes:
    rep = injury_report(3, seed=seed, game_date=game_date)
    for row in rep["players"][:changed]:
        row["injury_status"] = "available" if row["injury_status"] != "available" else "out"
    return json.dumps(rep).encode()


def filter_config(tmp_path: Path, project: str, subscription: str, destination: str) -> Path:
    return write_config(
        tmp_path / "filter.yaml",
        {
            "project": project,
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "publisher": {"backend": "pubsub", "timeout": "20s"},
            "records": {"backend": "sqlite", "path": str(tmp_path / "decisions.db")},
            "routes": [
                {
                    "name": ROUTE,
                    "subscription": subscription,
                    "destination": destination,
                    "key": ["payload.game_date"],
                    "rows": "payload.players",
                    "row_key": ["player_lookup", "game_id"],
                    "include": ["player_lookup", "game_id", "injury_status", "reason"],
                }
            ],
        },
    )


def decide_now(config_path: Path, host: str, admin: PubsubAdmin, sub: str, ids: list[str]) -> list[str]:
    """A working instance decides `ids` as they arrive on `sub` (engine from the config, as pull would);
    anything else it nacks (that part of the route is still failing)."""
    from pubsub_filter.core.config.schema import load
    from pubsub_filter.google.received import received_message
    from pubsub_filter.runtime.wiring import make_engine

    path = admin.subscription_path(sub)
    wanted = set(ids)

    async def run() -> list[str]:
        with emulator_env(host):
            engine = make_engine(load(config_path))
        decisions = []
        try:
            while wanted:
                resp = await asyncio.to_thread(
                    admin.subscriber.pull, request={"subscription": path, "max_messages": 10}, timeout=10
                )
                for r in resp.received_messages:
                    m = r.message
                    if m.message_id not in wanted:
                        await asyncio.to_thread(
                            admin.subscriber.modify_ack_deadline,
                            request={"subscription": path, "ack_ids": [r.ack_id], "ack_deadline_seconds": 0},
                        )
                        continue
                    wanted.discard(m.message_id)
                    msg = received_message(_Flat(m, r.delivery_attempt), path)
                    decisions.append(str((await engine.handle(ROUTE, msg)).record.decision))
                    await asyncio.to_thread(
                        admin.subscriber.acknowledge, request={"subscription": path, "ack_ids": [r.ack_id]}
                    )
        finally:
            await engine.recorder.close()
            await engine.publisher.close()
            await engine.store.close()
        return decisions

    return asyncio.run(run())


class _Flat:
    """A synchronously pulled message in the shape of a streaming-pull one (what `received_message` reads)."""

    def __init__(self, m: Any, delivery_attempt: int):
        self.data, self.attributes, self.message_id = m.data, m.attributes, m.message_id
        self.publish_time, self.ordering_key, self.delivery_attempt = m.publish_time, m.ordering_key, delivery_attempt


def test_through_filter_stops_stale_and_unchanged_and_forwards_new(
    admin: PubsubAdmin, rig: DeadLetterRig, env: dict[str, str], tmp_path: Path, pubsub_emulator: PubsubEmulator
) -> None:
    dest = admin.topic("dest")
    dest_sub = rig.subscription(dest, "downstream")
    cfg = filter_config(tmp_path, admin.project, rig.sub, dest)

    old = admin.publish(rig.source, report("2026-03-01", seed=1), source="nbac")
    same_old = admin.publish(rig.source, report("2026-03-02", seed=1), source="nbac")
    new_key = admin.publish(rig.source, report("2026-03-03", seed=1), source="nbac")
    # Published after those: newer content for 03-01, the same content (other scrape noise) for 03-02.
    newer = admin.publish(rig.source, report("2026-03-01", seed=2, changed=1), source="nbac")
    same_new = admin.publish(rig.source, report("2026-03-02", seed=2), source="nbac")
    # The later two get through; the first three keep failing and are dead-lettered after
    # them, so their dead-lettered copies are NEWER than `newer`: only the original publish
    # time tells the stale guard that `old` is older.
    assert decide_now(cfg, pubsub_emulator.host, admin, rig.sub, [newer, same_new]) == ["forwarded", "forwarded"]
    rig.dead_letter([old, same_old, new_key])
    assert len(admin.pull(dest_sub, 2)) == 2

    dead = {json.loads(d.data)["game_date"]: d for d in rig.peek_dead_letters(3)}
    result = run_replay([rig.dlq_sub, "--wait", "1", "--through-filter", "--config", str(cfg)], env)

    assert result.code == 0, result
    assert counted(result, "replayed") == 1
    assert counted(result, "skipped by the filter") == 2
    assert "stale 1" in result.stdout and "suppressed 1" in result.stdout
    [forwarded] = received(admin, dest_sub, 1)
    assert forwarded.attributes["filter_route"] == ROUTE
    assert forwarded.attributes[ATTR_COUNT] == "1"
    assert json.loads(forwarded.data)["game_date"] == "2026-03-03"
    admin.assert_nothing_more(rig.sub, 0.5)  # not re-cascaded through the source topic
    # The stale decision compared the ORIGINAL publish time, not the dead-lettering's.
    rows = records(tmp_path / "decisions.db")
    [stale] = [r for r in rows if r["decision"] == "stale"]
    [newer_row] = [r for r in rows if r["message_id"] == newer]
    assert stale["key"] == "2026-03-01"
    original = parse_time(dead["2026-03-01"].attributes["CloudPubSubDeadLetterSourceTopicPublishTime"])
    assert stale["publish_time"] == pytest.approx(original, abs=1e-6)
    assert stale["publish_time"] < newer_row["publish_time"] < parse_time(dead["2026-03-01"].publish_time)
    again = run_replay([rig.dlq_sub, "--wait", "1", "--through-filter", "--config", str(cfg)], env)
    assert (again.code, counted(again, "replayed"), counted(again, "skipped by the filter")) == (0, 0, 0), again


def test_through_filter_forwards_a_dead_letter_without_its_key_fail_open(
    admin: PubsubAdmin, rig: DeadLetterRig, env: dict[str, str], tmp_path: Path
) -> None:
    dest = admin.topic("dest")
    dest_sub = rig.subscription(dest, "downstream")
    cfg = filter_config(tmp_path, admin.project, rig.sub, dest)
    # A producer renamed the key field: rejected (400) until on_missing_key, so dead-lettered.
    keyless = admin.publish(rig.source, b'{"date": "2026-03-01", "players": []}', source="nbac")
    rig.dead_letter([keyless])

    result = run_replay([rig.dlq_sub, "--wait", "1", "--through-filter", "--config", str(cfg)], env)

    assert result.code == 0, result
    assert counted(result, "replayed") == 1, result
    [forwarded] = received(admin, dest_sub, 1)
    assert forwarded.data == b'{"date": "2026-03-01", "players": []}'
    assert (forwarded.attributes["filter_route"], forwarded.attributes["source"]) == (ROUTE, "nbac")
    assert (
        forwarded.attributes["filter_fingerprint"].startswith("sha256:") and "filter_fence" not in forwarded.attributes
    )
    [row] = records(tmp_path / "decisions.db")
    assert (row["decision"], row["key"]) == ("fail_open", None)
    assert row["reason"].startswith("key field payload.game_date is missing: forwarded without a dedup decision")


def test_the_local_dead_letter_example_makes_dead_letters_that_replay_lists(
    pubsub_emulator: PubsubEmulator, env: dict[str, str]
) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "local_dead_letters.py"
    made = subprocess.run(
        [sys.executable, str(example), '{"game_date": "2025-01-10", "players": []}'],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    assert "1 message(s) in local-source-sub-dlq-sub" in made.stdout
    listed = run_replay(["local-source-sub-dlq-sub", "--dry-run", "--wait", "2"], env)
    assert listed.code == 0, listed
    assert "would be replayed:     1" in listed.stdout, listed
    assert "to projects/" in listed.stdout and "/topics/local-source" in listed.stdout, listed
