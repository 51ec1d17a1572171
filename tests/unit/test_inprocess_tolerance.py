"""`tolerance`, `changed_attributes` and `on_missing_key` through the in-process API (`Filter`,
`SyncFilter`): the body runs where the sidecar would publish, on what it would publish."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.model import Decision
from pubsub_filter.inprocess import Filter, Forward, SyncFilter
from tests.support.clock import ManualClock
from tests.support.tolerance_routes import props_route
from tests.support.watchdog import within

ROUTES: list[dict[str, Any]] = [
    {
        "name": "odds",
        "destination": "phase3",
        "key": ["payload.game_id"],
        "exclude": ["scraped"],
        "tolerance": {"price": 12},
        "changed_attributes": ["price", "status"],
    },
    props_route("props", "phase3"),
    {"name": "strict", "destination": "phase3", "key": ["payload.game_id"], "on_missing_key": "reject"},
]


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return parse(
        {
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "records": {"backend": "sqlite", "path": str(tmp_path / "records.db")},
            "routes": ROUTES,
        }
    )


@pytest.fixture
def sync(config: Config) -> Iterator[SyncFilter]:
    f = SyncFilter(config, clock=ManualClock(time.time()))
    yield f
    within(f.close, name="close")


def odds(price: int, status: str = "open", scraped: str = "1") -> dict[str, Any]:
    return {"game_id": "g1", "price": price, "status": status, "scraped": scraped}


def props(*prices: int, status: str = "open") -> dict[str, Any]:
    return {"game_id": "g1", "props": [{"player": f"p{i}", "price": p, "status": status} for i, p in enumerate(prices)]}


def flags(forward: Forward) -> set[str]:
    return {k.removeprefix("filter_changed_") for k in forward.attributes if k.startswith("filter_changed_")}


async def test_a_price_walk_within_tolerance_is_skipped_then_a_jump_runs_the_body_flagged(config: Config) -> None:
    ran: list[Forward] = []

    async def body(forward: Forward) -> None:
        ran.append(forward)

    async with Filter(config, clock=ManualClock(time.time())) as f:
        outcomes = [
            await f.process("odds", odds(price, scraped=str(i)), body, message_id=f"m{i}")
            for i, price in enumerate([100, 105, 110, 96, 113])
        ]
    assert [(o.decision, o.ran) for o in outcomes] == [
        (Decision.FORWARDED, True),
        *[(Decision.SUPPRESSED, False)] * 3,
        (Decision.FORWARDED, True),
    ]
    assert {o.reason for o in outcomes[1:4]} == {"moved within tolerance"}
    assert all(o.skipped and o.acked for o in outcomes[1:4])
    assert outcomes[2].record.details["within_tolerance"] == {"price": 10}
    # the first forward cannot know what downstream holds: every listed field; the jump: the price only
    assert [flags(fw) for fw in ran] == [{"price", "status"}, {"price"}]
    assert json.loads(ran[-1].data)["price"] == 113


def test_a_row_route_suppresses_moves_within_tolerance_and_flags_what_changed_beyond(sync: SyncFilter) -> None:
    ran: list[Forward] = []
    got = [
        sync.process("props", payload, ran.append, message_id=f"m{i}")
        for i, payload in enumerate(
            [props(100, 200), props(108, 195), props(108, 195, status="out"), props(121, 195, status="out")]
        )
    ]
    assert [o.decision for o in got] == [
        Decision.FORWARDED,
        Decision.SUPPRESSED,
        Decision.FORWARDED,
        Decision.FORWARDED,
    ]
    assert got[1].reason == "moved within tolerance"
    # the status forward carries the rows as they are: p0's reference is now 108, so 121 is beyond
    assert [flags(fw) for fw in ran] == [{"price", "status"}, {"status"}, {"price"}]


def test_a_message_without_its_key_runs_the_body_fail_open_without_a_lease(sync: SyncFilter) -> None:
    ran: list[Forward] = []
    first = sync.process("odds", {"price": 100}, ran.append, message_id="m1")
    again = sync.process("odds", {"price": 100}, ran.append, message_id="m1")  # no key, so no dedup either
    assert [(o.decision, o.ran, o.acked, o.committed) for o in (first, again)] == [
        (Decision.FAIL_OPEN, True, True, False)
    ] * 2
    assert first.reason is not None and first.reason.startswith("key field payload.game_id is missing")
    assert [(fw.key, fw.fence, json.loads(fw.data)) for fw in ran] == [(None, None, {"price": 100})] * 2
    assert flags(ran[0]) == {"price", "status"}  # nothing to compare with: every listed field


def test_a_route_that_rejects_a_message_without_its_key_does_not_run_the_body(sync: SyncFilter) -> None:
    ran: list[Forward] = []
    got = sync.process("strict", {"price": 100}, ran.append, message_id="m1")
    assert (got.decision, got.ran, got.acked) == (Decision.REJECTED, False, False)
    assert got.reason == "key field payload.game_id is missing" and ran == []
