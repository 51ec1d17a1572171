"""`pubsub-filter pull` against the Pub/Sub emulator on a `coalesce` route: a burst of one key
forwards once, its newest content, and every older message is acked `superseded`; a SIGTERM
decides what is held at once, inside the stop."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.model import ACKED
from tests.support.dlq import PullProcess
from tests.support.emulators import PubsubEmulator
from tests.support.pubsub_helpers import PubsubAdmin
from tests.support.serve import write_config

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(180)]

FINAL = {str(d) for d in ACKED}
BURST = 10


class World:
    def __init__(self, emu: PubsubEmulator, tmp_path: Path, quiet: str, max_wait: str, ack_deadline: int = 30):
        self.admin = PubsubAdmin(emu)
        self.source = self.admin.topic("odds")
        self.sub = self.admin.pull_subscription(self.source, "odds-sub", ack_deadline=ack_deadline)
        self.dest = self.admin.topic("odds-dest")
        self.downstream = self.admin.pull_subscription(self.dest, "downstream")
        route = {
            "name": "odds",
            "subscription": self.sub,
            "destination": self.dest,
            "key": ["payload.line"],
            "coalesce": {"quiet": quiet, "max_wait": max_wait},
        }
        config = {
            "project": emu.project,
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "publisher": {"backend": "pubsub", "timeout": "20s"},
            "records": {"backend": "sqlite", "path": str(tmp_path / "decisions.db")},
            "routes": [route],
        }
        env = {"PUBSUB_EMULATOR_HOST": emu.host, "GOOGLE_CLOUD_PROJECT": emu.project, "LOG_LEVEL": "info"}
        self.proc = PullProcess(write_config(tmp_path / "pull.yaml", config), tmp_path / "pull.log", env=env)

    def burst(self) -> list[str]:
        """One key's price moves, each published once the one before it was (publish times in order)."""
        return [
            self.admin.publish(self.source, json.dumps({"line": "L1", "price": 100 + i}).encode()) for i in range(BURST)
        ]

    def decisions(self, ids: list[str], timeout: float = 60.0) -> dict[str, dict[str, Any]]:
        wanted = set(ids)
        ready = self.proc.wait_decisions(
            lambda ds: wanted <= {d["message_id"] for d in ds if d["decision"] in FINAL}, timeout
        )
        return {d["message_id"]: d for d in ready if d["message_id"] in wanted and d["decision"] in FINAL}

    def close(self) -> None:
        try:
            if self.proc.proc is not None:
                self.proc.stop()
        finally:
            self.admin.cleanup()


@pytest.fixture
def world(pubsub_emulator: PubsubEmulator, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[World]:
    quiet, max_wait, *deadline = getattr(request, "param", ("2s", "8s"))
    w = World(pubsub_emulator, tmp_path, quiet, max_wait, *deadline)
    try:
        w.proc.start()
        yield w
    finally:
        w.close()


def test_pull_forwards_a_burst_once_with_its_newest_content(world: World) -> None:
    ids = world.burst()
    decided = world.decisions(ids)
    assert [decided[m]["decision"] for m in ids] == ["superseded"] * (BURST - 1) + ["forwarded"]
    for i, older in enumerate(ids[:-1]):
        assert decided[older]["superseded_by"] in ids[i + 1 :], older  # by a newer message of the burst
    [sent] = world.admin.pull(world.downstream, 1)
    assert json.loads(sent.data) == {"line": "L1", "price": 100 + BURST - 1}
    world.admin.assert_nothing_more(world.downstream, 1.0)
    world.admin.assert_nothing_more(world.sub, 1.0)  # everything acked: nothing comes back


@pytest.mark.parametrize("world", [("25s", "30s")], indirect=True)
def test_a_sigterm_decides_what_is_held_at_once(world: World) -> None:
    ids = world.burst()
    world.decisions(ids[:-1])  # the older ones are superseded: the newest is held (25 s of quiet to go)
    world.proc.stop()  # SIGTERM: exit 0 inside the stop budget
    events = world.proc.events()
    [last] = [e for e in events if e.get("message") == "decision" and e.get("message_id") == ids[-1]]
    assert last["decision"] == "forwarded"
    [sent] = world.admin.pull(world.downstream, 1)
    assert json.loads(sent.data)["price"] == 100 + BURST - 1


@pytest.mark.parametrize("world", [("14s", "20s", 10)], indirect=True)
def test_a_message_held_past_the_subscriptions_ack_deadline_keeps_its_lease_and_is_not_redelivered(
    world: World,
) -> None:
    ids = world.burst()  # the newest is held 14 s, past the subscription's 10 s ack deadline
    decided = world.decisions(ids, timeout=90)
    assert decided[ids[-1]]["decision"] == "forwarded"
    lines = [e for e in world.proc.events() if e.get("message") == "decision"]
    # the client library extended the held message's deadline: no delivery came again
    assert sorted(e["message_id"] for e in lines) == sorted(ids)
    assert all(e.get("delivery_attempt") in (None, 1) for e in lines)
    world.admin.assert_nothing_more(world.sub, 1.0)
