"""End to end on a `coalesce` route: the Pub/Sub emulator pushes a burst of one key to
`pubsub-filter serve` (Firestore emulator state); the request of the burst's newest message is
held open until the key is quiet, the older ones are answered `superseded` at once, and
downstream receives the newest content once. With two instances behind one push endpoint
each holds its part of the burst, and no older content is forwarded after newer (the lease and
the stale guard): the last forward is the newest message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pubsub_filter.core.model import ACKED
from tests.support.serve import ServeProcess, wait_decisions

from .conftest import ROUTE, Pipeline, RoundRobin

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

FINAL = {str(d) for d in ACKED}
BURST = 8
# inside the push subscription's 10 s ack deadline: held 3 s, the store's 3 s, the publish's 3 s
TIMING: dict[str, Any] = {"publisher_timeout": "3s", "store_errors": {"timeout": "1s", "budget": "3s"}}


def odds_route(pipeline: Pipeline) -> dict[str, Any]:
    return {
        "name": ROUTE,
        "subscription": pipeline.push_sub_id,
        "destination": pipeline.dest,
        "key": ["payload.line"],
        "coalesce": {"quiet": "1s", "max_wait": "3s"},
    }


def burst(pipeline: Pipeline) -> list[str]:
    # one by one, so each has its own publish time, in order
    return [pipeline.publish({"line": "L1", "price": 100 + i}) for i in range(BURST)]


def finals(procs: list[ServeProcess], ids: list[str], timeout: float = 60.0) -> dict[str, dict[str, Any]]:
    wanted = set(ids)
    by_proc = wait_decisions(
        procs, lambda ds: wanted <= {d["message_id"] for d in ds if d["decision"] in FINAL}, timeout
    )
    out: dict[str, dict[str, Any]] = {}
    for name, ds in by_proc.items():
        for d in ds:
            if d["message_id"] in wanted and d["decision"] in FINAL:
                out[d["message_id"]] = dict(d, proc=name)
    return out


def test_push_holds_the_newest_of_a_burst_and_forwards_it_once(pipeline: Pipeline) -> None:
    proc = pipeline.start_filter(routes=[odds_route(pipeline)], **TIMING)
    pipeline.subscribe(proc.url(f"/push/{ROUTE}"))
    ids = burst(pipeline)
    decided = finals([proc], ids)
    forwarded = [m for m in ids if decided[m]["decision"] == "forwarded"]
    assert forwarded == [ids[-1]]
    assert {decided[m]["decision"] for m in ids[:-1]} == {"superseded"}
    [got] = pipeline.downstream(1)
    assert json.loads(got.data) == {"line": "L1", "price": 100 + BURST - 1}
    pipeline.assert_no_more_downstream(2.0)
    pipeline.assert_nothing_dead_lettered()


def test_two_instances_forward_no_older_content_after_newer_and_end_on_the_newest(pipeline: Pipeline) -> None:
    procs = [pipeline.start_filter(name, routes=[odds_route(pipeline)], **TIMING) for name in ("a", "b")]
    front = RoundRobin([p.url() for p in procs]).start()
    pipeline.on_teardown(front.stop)
    pipeline.subscribe(front.url(f"/push/{ROUTE}"), max_delivery_attempts=50)
    ids = burst(pipeline)
    decided = finals(procs, ids, timeout=90)
    forwards = sorted((d for d in decided.values() if d["decision"] == "forwarded"), key=lambda d: d["time"])
    # The emulator paces pushes to a subscription by its acks, so a burst reaches the two
    # instances spread out, and each may see more than one burst of its own. What must hold:
    # no older content is forwarded after newer (the lease and the stale guard), the last
    # forward is the newest message, and everything older not forwarded is superseded or stale.
    times = [d["publish_time"] for d in forwards]
    assert times == sorted(times), forwards
    assert forwards[-1]["message_id"] == ids[-1]
    assert {d["decision"] for d in decided.values()} <= {"forwarded", "superseded", "stale"}
    sent = pipeline.downstream(len(forwards))
    assert max(json.loads(m.data)["price"] for m in sent) == 100 + BURST - 1
    pipeline.assert_no_more_downstream(2.0)
    pipeline.assert_nothing_dead_lettered()


def test_a_sigterm_decides_the_held_request_at_once_and_answers_it(pipeline: Pipeline) -> None:
    route = dict(odds_route(pipeline), coalesce={"quiet": "25s", "max_wait": "30s"})
    lease = {"duration": "120s", "ack_deadline": "60s", "heartbeat": "20s"}
    proc = pipeline.start_filter(routes=[route], lease=lease, **TIMING)
    pipeline.subscribe(proc.url(f"/push/{ROUTE}"), ack_deadline=60)
    ids = burst(pipeline)
    finals([proc], ids[:-1])  # the older ones superseded: the newest is held, 25 s of quiet to go
    proc.stop()  # SIGTERM: the held request is decided now, answered, and serve exits 0
    [last] = [d for d in proc.decisions() if d["message_id"] == ids[-1]]
    assert last["decision"] == "forwarded"
    [got] = pipeline.downstream(1)
    assert json.loads(got.data)["price"] == 100 + BURST - 1
