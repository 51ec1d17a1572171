"""End to end with payload unwrapping: the Pub/Sub emulator pushes the data as the body (with
its metadata and attributes as headers, or nothing but the body) to `pubsub-filter serve`.

The emulator honours `no_wrapper` as Pub/Sub does (checked here: with write metadata it
sends `x-goog-pubsub-message-id`, `-publish-time`, `-subscription-name` and each attribute
as a header under its own name, mixed case included; without, the body alone), so these
pushes are the real thing, not envelopes built by the test.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pubsub_filter.push.unwrapped import data_id
from tests.support.serve import ServeProcess

from .conftest import ROUTE, Pipeline, route_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


def report(status: str = "out", scraped: str = "08:00") -> dict[str, Any]:
    return {
        "game_date": "2026-01-10",
        "scrape_time": scraped,  # outside the route's include list: never counts
        "players": [{"player_lookup": "p1", "game_id": "g1", "game_date": "2026-01-10", "injury_status": status}],
    }


def start(pipeline: Pipeline, push_format: str) -> ServeProcess:
    route = {**route_config(pipeline.push_sub_id, pipeline.dest), "push_format": push_format}
    proc = pipeline.start_filter(routes=[route])
    pipeline.subscribe(proc.url(f"/push/{ROUTE}"), write_metadata=push_format == "unwrapped")
    return proc


def decided(proc: ServeProcess, count: int) -> list[dict[str, Any]]:
    return proc.wait_decisions(lambda ds: len(ds) >= count)


def test_an_unwrapped_push_with_metadata_is_decided_as_a_wrapped_one(pipeline: Pipeline) -> None:
    proc = start(pipeline, "unwrapped")
    first = pipeline.publish(report(), Source="nbac_injury_report", run="r1")
    decided(proc, 1)
    second = pipeline.publish(report(scraped="12:00"), Source="nbac_injury_report", run="r2")
    ds = decided(proc, 2)

    assert [(d["message_id"], d["decision"]) for d in ds] == [(first, "forwarded"), (second, "suppressed")]
    [got] = pipeline.downstream(1)
    assert json.loads(got.data) == report()
    assert got.attributes["filter_source_message_id"] == first
    # the attributes, as HTTP delivers them: names lower-cased, values exactly
    assert {k: v for k, v in got.attributes.items() if not k.startswith("filter_")} == {
        "source": "nbac_injury_report",
        "run": "r1",
    }
    pipeline.assert_no_more_downstream(2.0)
    pipeline.assert_nothing_dead_lettered()


def test_an_unwrapped_push_without_metadata_is_decided_on_its_content(pipeline: Pipeline) -> None:
    proc = start(pipeline, "unwrapped_no_metadata")
    pipeline.publish(report())
    decided(proc, 1)
    pipeline.publish(report())  # the same bytes again: a redelivery would look just like it
    decided(proc, 2)
    pipeline.publish(report(status="available"))
    ds = decided(proc, 3)

    body = json.dumps(report()).encode()
    assert [(d["message_id"], d["decision"]) for d in ds] == [
        (data_id(body), "forwarded"),
        (data_id(body), "suppressed"),
        (data_id(json.dumps(report(status="available")).encode()), "forwarded"),
    ]
    got = pipeline.downstream(2)
    assert [json.loads(g.data)["players"][0]["injury_status"] for g in got] == ["out", "available"]
    assert all(k.startswith("filter_") for g in got for k in g.attributes)  # no attributes without metadata
    pipeline.assert_no_more_downstream(2.0)
    pipeline.assert_nothing_dead_lettered()
