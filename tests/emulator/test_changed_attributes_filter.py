"""A downstream team subscribes to only what it needs: the forwards a subscription filter on a
`filter_changed_<FIELD>` flag would select are exactly those that changed that field.

The Pub/Sub emulator keeps a subscription's filter but does not apply it (it delivers every
message to every subscription): the second test pins that, so that the day an emulator
applies filters it fails and the first test can subscribe through the filter itself.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from pubsub_filter.backends.publishers.pubsub import PubsubPublisher
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from tests.support.emulators import PubsubEmulator
from tests.support.fakes import MemoryRecorder
from tests.support.pubsub_helpers import PubsubAdmin, emulator_env

pytestmark = pytest.mark.emulator

FILTER = "attributes:filter_changed_injury_status"


async def test_forwards_flag_exactly_the_fields_that_changed_for_a_subscription_filter_to_select(
    pubsub_emulator: PubsubEmulator, admin: PubsubAdmin
) -> None:
    topic = admin.topic("injuries")
    sub = admin.pull_subscription(topic, "all")
    route = {
        "name": "injuries",
        "destination": topic,
        "key": ["payload.game_date"],
        "tolerance": {"minutes": 5},
        "changed_attributes": ["injury_status", "minutes"],
    }
    with emulator_env(pubsub_emulator.host):
        publisher = PubsubPublisher(project=pubsub_emulator.project, timeout=20)
    steps = [
        ({"injury_status": "out", "minutes": 30}, Decision.FORWARDED),  # a new key: every field flagged
        ({"injury_status": "out", "minutes": 32}, Decision.SUPPRESSED),  # within tolerance
        ({"injury_status": "out", "minutes": 40}, Decision.FORWARDED),  # minutes only
        ({"injury_status": "questionable", "minutes": 40}, Decision.FORWARDED),  # the status only
    ]
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(parse({"routes": [route]}), SqliteStore(Path(tmp) / "s.db"), publisher, MemoryRecorder())
        try:
            for i, (body, want) in enumerate(steps):
                data = json.dumps({"game_date": "2026-01-10", **body}).encode()
                rec = (await engine.handle("injuries", Message(data, {}, f"m{i}"))).record
                assert rec.decision is want, rec
        finally:
            await engine.close()
    got = admin.pull(sub, 3)
    flags = {
        m.attributes["filter_source_message_id"]: sorted(k for k in m.attributes if k.startswith("filter_changed_"))
        for m in got
    }
    assert flags == {
        "m0": ["filter_changed_injury_status", "filter_changed_minutes"],
        "m2": ["filter_changed_minutes"],
        "m3": ["filter_changed_injury_status"],
    }
    # what `attributes:filter_changed_injury_status` selects: the forwards that changed the status
    assert sorted(
        m.attributes["filter_source_message_id"] for m in got if "filter_changed_injury_status" in m.attributes
    ) == [
        "m0",
        "m3",
    ]


def test_the_emulator_keeps_a_subscription_filter_but_does_not_apply_it(admin: PubsubAdmin) -> None:
    topic = admin.topic("filtered")
    sub = admin.pull_subscription(topic, "filtered", message_filter=FILTER)
    assert admin.subscriber.get_subscription(subscription=admin.subscription_path(sub)).filter == FILTER
    admin.publish(topic, b"no flag")
    delivered = admin.pull(sub, 1, timeout=10)
    assert [m.data for m in delivered] == [b"no flag"], "the emulator applies filters now: prove the flags through it"
