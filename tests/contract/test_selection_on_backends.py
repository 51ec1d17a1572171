"""A route whose selection changed between two forwards, on each StateStore backend: the state
knows which selection produced it, a narrowing forwards nothing that did not change, a widening
does what the route's `new_fields` says, and a changed key is a new keyspace."""

from __future__ import annotations

import json
from typing import Any

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, DecisionRecord, Message
from tests.support.fakes import MemoryPublisher, MemoryRecorder

WHOLE: dict[str, Any] = {"name": "r", "destination": "out", "key": ["payload.k"], "exclude": ["scraped_at"]}
ROWS: dict[str, Any] = {
    "name": "r",
    "destination": "out",
    "key": ["payload.k"],
    "rows": "payload.rows",
    "row_key": ["id"],
    "exclude": ["scraped_at"],
}


def config(route: dict[str, Any], **changes: Any) -> Config:
    return parse({"routes": [{**route, **changes}], "store_errors": {"timeout": "10s", "budget": "20s"}})


class Rig:
    def __init__(self, store: Any):
        self.store = store
        self.publisher = MemoryPublisher()
        self.recorder = MemoryRecorder()
        self.n = 0
        self.engine: Engine | None = None

    def deploy(self, cfg: Config) -> None:
        self.engine = Engine(cfg, GuardedStore(self.store, cfg.store_errors), self.publisher, self.recorder)

    async def send(self, payload: dict[str, Any]) -> DecisionRecord:
        assert self.engine is not None
        self.n += 1
        msg = Message(json.dumps(payload).encode(), {}, f"m{self.n}")
        return (await self.engine.handle("r", msg)).record


def whole(k: str, v: int, note: str = "n", scraped: int = 0) -> dict[str, Any]:
    return {"k": k, "v": v, "note": note, "scraped_at": scraped}


def rows_of(k: str, v: int, note: str = "n", scraped: int = 0) -> dict[str, Any]:
    return {"k": k, "rows": [{"id": i, "v": v + i, "note": note, "scraped_at": scraped} for i in range(3)]}


async def test_each_forward_stores_the_selection_it_was_judged_under(store: Any) -> None:
    rig = Rig(store)
    cfg = config(WHOLE)
    rig.deploy(cfg)
    await rig.send(whole("a", 1))
    state = await store.read("r", "a")
    assert state.selection == RouteRules(cfg.routes[0]).selection_text


async def test_an_exclude_widened_forwards_nothing_that_did_not_change(store: Any) -> None:
    rig = Rig(store)
    rig.deploy(config(WHOLE))
    for k in "abc":
        assert (await rig.send(whole(k, 1, scraped=1))).decision is Decision.FORWARDED
    rig.deploy(config(WHOLE, exclude=["scraped_at", "note"]))
    before = {k: await store.read("r", k) for k in "abc"}
    for k in "abc":
        rec = await rig.send(whole(k, 1, note="other", scraped=2))
        assert rec.decision is Decision.SUPPRESSED, rec.reason
        assert rec.reason is not None and rec.reason.startswith("selection changed (exclude +note)")
        assert rec.extra["selection_change"] == "narrowed"
    # a suppression writes nothing: each key's state is as it was, version included
    for k in "abc":
        assert (await store.read("r", k)).version == before[k].version
    assert len(rig.publisher.published) == 3
    changed = await rig.send(whole("a", 2))
    assert changed.decision is Decision.FORWARDED
    assert changed.reason == "selection changed (exclude +note): changed: v"
    # that forward wrote the new selection: judged as usual from now on
    again = await rig.send(whole("a", 2, note="third"))
    assert (again.decision, again.reason) == (Decision.SUPPRESSED, "unchanged since last forward")


async def test_fewer_row_fields_forward_nothing_that_did_not_change(store: Any) -> None:
    rig = Rig(store)
    rig.deploy(config(ROWS))
    assert (await rig.send(rows_of("a", 1))).decision is Decision.FORWARDED
    rig.deploy(config(ROWS, exclude=["scraped_at", "note"]))
    rec = await rig.send(rows_of("a", 1, note="other", scraped=5))
    assert rec.decision is Decision.SUPPRESSED, rec.reason
    assert rec.reason is not None and rec.reason.startswith("selection changed")
    changed = await rig.send(rows_of("a", 2, note="other"))
    assert changed.decision is Decision.FORWARDED
    assert changed.reason == "selection changed (exclude +note): changed: v"


async def test_a_widening_forwards_once_naming_the_new_fields_by_default(store: Any) -> None:
    for route, make, key in ((WHOLE, whole, "w"), (ROWS, rows_of, "wr")):
        rig = Rig(store)
        rig.deploy(config(route, exclude=["scraped_at", "note"]))
        assert (await rig.send(make(key, 1))).decision is Decision.FORWARDED
        rig.deploy(config(route))
        rec = await rig.send(make(key, 1))
        assert rec.decision is Decision.FORWARDED
        assert (
            rec.reason == "selection changed (exclude -note): newly compared note, forwarded once (new_fields: forward)"
        )
        assert rec.extra["newly_compared"] == ["note"]
        again = await rig.send(make(key, 1))
        assert (again.decision, again.reason) == (Decision.SUPPRESSED, "unchanged since last forward")


async def test_a_widening_adopts_the_new_fields_when_the_route_says_so(store: Any) -> None:
    for route, make in ((WHOLE, whole), (ROWS, rows_of)):
        rig = Rig(store)
        key = f"adopt-{'rows' if make is rows_of else 'whole'}"
        rig.deploy(config(route, exclude=["scraped_at", "note"]))
        assert (await rig.send(make(key, 1))).decision is Decision.FORWARDED
        rig.deploy(config(route, new_fields="adopt"))
        rec = await rig.send(make(key, 1, note="other"))
        assert rec.decision is Decision.SUPPRESSED, rec.reason
        assert rec.reason is not None and "adopted with the next forward (new_fields: adopt)" in rec.reason
        changed = await rig.send(make(key, 2, note="other"))
        assert changed.decision is Decision.FORWARDED
        # now the note is part of what the destination holds: a change in it is a change
        note = await rig.send(make(key, 2, note="third"))
        assert (note.decision, note.reason) == (Decision.FORWARDED, "content changed")


async def test_a_changed_key_is_a_new_keyspace(store: Any) -> None:
    rig = Rig(store)
    rig.deploy(config(WHOLE))
    await rig.send(whole("a", 1))
    # the same key values read from another field: the state found is another keyspace's
    rig.deploy(config(WHOLE, key=["payload.id"]))
    rec = await rig.send({"k": "x", "id": "a", "v": 1, "note": "n", "scraped_at": 0})
    assert rec.decision is Decision.FORWARDED
    assert (
        rec.reason
        == "new key: the route's key changed (payload.k -> payload.id): a new keyspace, not a selection change"
    )


async def test_state_written_before_selections_is_read_as_the_routes_selection(store: Any) -> None:
    rig = Rig(store)
    rig.deploy(config(WHOLE))
    await rig.send(whole("a", 1))
    state = await store.read("r", "a")
    from dataclasses import replace

    lease_taken = await store.claim("r", "a", state, replace(state, selection=None))
    assert lease_taken is not None
    rec = await rig.send(whole("a", 1, scraped=3))
    assert (rec.decision, rec.reason) == (Decision.SUPPRESSED, "unchanged since last forward")


async def test_content_a_then_b_then_a_forwards_all_three_across_selection_changes(store: Any) -> None:
    rig = Rig(store)
    rig.deploy(config(WHOLE))
    assert (await rig.send(whole("aba", 1))).decision is Decision.FORWARDED
    rig.deploy(config(WHOLE, exclude=["scraped_at", "note"]))
    b = await rig.send(whole("aba", 2, note="other"))
    assert (b.decision, b.reason) == (Decision.FORWARDED, "selection changed (exclude +note): changed: v")
    rig.deploy(config(WHOLE))
    a = await rig.send(whole("aba", 1, note="other"))
    assert a.decision is Decision.FORWARDED and a.reason is not None
    assert a.reason.startswith("selection changed (exclude -note): changed: v"), a.reason
    assert [json.loads(p.data)["v"] for p in rig.publisher.published] == [1, 2, 1]
