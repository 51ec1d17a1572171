"""`pubsub-filter pull` against the Pub/Sub emulator on a route with `tolerance` and
`changed_attributes`: a price walk within tolerance is suppressed, a jump is forwarded with
the `filter_changed_<FIELD>` attributes of what changed, and a message without its key flows
(`on_missing_key: forward`, the default) with every listed field flagged."""

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
from tests.support.tolerance_routes import props_route

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(180)]

ROUTE = "props"
FINAL = {str(d) for d in ACKED}


class World:
    def __init__(self, emu: PubsubEmulator, tmp_path: Path):
        self.admin = PubsubAdmin(emu)
        self.source = self.admin.topic("props")
        self.sub = self.admin.pull_subscription(self.source, "props-sub")
        self.dest = self.admin.topic("props-dest")
        self.downstream = self.admin.pull_subscription(self.dest, "downstream")
        config = {
            "project": emu.project,
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "publisher": {"backend": "pubsub", "timeout": "20s"},
            "records": {"backend": "sqlite", "path": str(tmp_path / "decisions.db")},
            "routes": [props_route(ROUTE, self.dest, subscription=self.sub)],
        }
        env = {"PUBSUB_EMULATOR_HOST": emu.host, "GOOGLE_CLOUD_PROJECT": emu.project, "LOG_LEVEL": "info"}
        self.proc = PullProcess(write_config(tmp_path / "pull.yaml", config), tmp_path / "pull.log", env=env)

    def decide(self, payload: Any) -> dict[str, Any]:
        """Publish `payload` and wait for its decision (one at a time: each is decided on the last)."""
        mid = self.admin.publish(self.source, json.dumps(payload).encode())
        ready = self.proc.wait_decisions(lambda ds: any(d["message_id"] == mid and d["decision"] in FINAL for d in ds))
        return next(d for d in ready if d["message_id"] == mid and d["decision"] in FINAL)

    def close(self) -> None:
        try:
            if self.proc.proc is not None:
                self.proc.stop()
        finally:
            self.admin.cleanup()


@pytest.fixture
def world(pubsub_emulator: PubsubEmulator, tmp_path: Path) -> Iterator[World]:
    w = World(pubsub_emulator, tmp_path)
    try:
        w.proc.start()
        yield w
    finally:
        w.close()


def props(*prices: int, status: str = "open") -> dict[str, Any]:
    return {"game_id": "g1", "props": [{"player": f"p{i}", "price": p, "status": status} for i, p in enumerate(prices)]}


def flags(attributes: dict[str, str]) -> set[str]:
    return {k.removeprefix("filter_changed_") for k, v in attributes.items() if k.startswith("filter_changed_")}


def test_pull_suppresses_a_price_walk_within_tolerance_and_forwards_a_jump_flagged(world: World) -> None:
    got = [world.decide(p) for p in (props(100, 200), props(105, 200), props(110, 206), props(113, 206))]
    assert [(d["decision"], d["reason"]) for d in got] == [
        ("forwarded", "new key"),
        ("suppressed", "moved within tolerance"),
        ("suppressed", "moved within tolerance"),
        ("forwarded", "content changed"),
    ]
    assert got[2]["within_tolerance"] == {"price": 10}  # the largest move, p0 by 10 (p1 by 6)
    sent = world.admin.pull(world.downstream, 2)
    assert [json.loads(m.data)["props"][0]["price"] for m in sent] == [100, 113]
    # the first forward cannot know what downstream holds: every listed field; the jump: the price only
    assert [flags(m.attributes) for m in sent] == [{"price", "status"}, {"price"}]
    world.admin.assert_nothing_more(world.downstream, 0.5)


def test_pull_forwards_a_message_without_its_key_with_every_listed_field_flagged(world: World) -> None:
    decided = world.decide({"props": [{"player": "p0", "price": 100}]})  # no game_id: the key
    assert (decided["decision"], decided["missing_field"]) == ("fail_open", "payload.game_id")
    [got] = world.admin.pull(world.downstream, 1)
    assert json.loads(got.data) == {"props": [{"player": "p0", "price": 100}]}
    assert flags(got.attributes) == {"price", "status"} and "filter_fence" not in got.attributes
