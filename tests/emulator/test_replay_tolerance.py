"""`pubsub-filter replay --through-filter` against the Pub/Sub emulator on a route with
`tolerance` and `changed_attributes`: a dead letter that moved within tolerance of the last
forward is skipped by the filter, one that jumped is replayed with the `filter_changed_<FIELD>`
attributes of what changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.dlq import DeadLetterRig, Result, counted, run_replay
from tests.support.emulators import PubsubEmulator
from tests.support.pubsub_helpers import PubsubAdmin
from tests.support.serve import records, write_config
from tests.support.tolerance_routes import props_route

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(240)]

ROUTE = "props"


def props(*prices: int, status: str = "open") -> bytes:
    rows = [{"player": f"p{i}", "price": p, "status": status} for i, p in enumerate(prices)]
    return json.dumps({"game_id": "g1", "props": rows}).encode()


def test_through_filter_skips_a_move_within_tolerance_and_replays_a_jump_flagged(
    admin: PubsubAdmin, rig: DeadLetterRig, pubsub_emulator: PubsubEmulator, tmp_path: Path
) -> None:
    dest = admin.topic("dest")
    downstream = rig.subscription(dest, "downstream")
    route: dict[str, Any] = props_route(ROUTE, dest, subscription=rig.sub)
    cfg = write_config(
        tmp_path / "filter.yaml",
        {
            "project": admin.project,
            "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
            "publisher": {"backend": "pubsub", "timeout": "20s"},
            "records": {"backend": "sqlite", "path": str(tmp_path / "decisions.db")},
            "routes": [route],
        },
    )
    env = {"PUBSUB_EMULATOR_HOST": pubsub_emulator.host, "GOOGLE_CLOUD_PROJECT": admin.project}

    def replay(data: bytes) -> Result:
        """Dead-letter one message, then replay it through the filter: one at a time, each decided on the last."""
        rig.dead_letter([admin.publish(rig.source, data)])
        result = run_replay([rig.dlq_sub, "--wait", "1", "--through-filter", "--config", str(cfg)], env)
        assert result.code == 0, result
        return result

    first, within, jump = replay(props(100, 200)), replay(props(108, 195)), replay(props(113, 195))

    assert [counted(r, "replayed") for r in (first, within, jump)] == [1, 0, 1]
    assert counted(within, "skipped by the filter") == 1
    rows = records(tmp_path / "decisions.db")
    assert [(r["decision"], r["reason"]) for r in rows] == [
        ("forwarded", "new key"),
        ("suppressed", "moved within tolerance"),
        ("forwarded", "content changed"),
    ]
    sent = admin.pull(downstream, 2)
    assert [json.loads(m.data)["props"][0]["price"] for m in sent] == [100, 113]
    flagged = [{k for k in m.attributes if k.startswith("filter_changed_")} for m in sent]
    # the first forward cannot know what downstream holds; the jump changed the price only
    assert flagged == [{"filter_changed_price", "filter_changed_status"}, {"filter_changed_price"}]
    admin.assert_nothing_more(downstream, 0.5)
