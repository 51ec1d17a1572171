"""A route's decoded stored states are bounded in bytes as well as in number: a rows route's
state can near the row-state cap (~900 KB), and a thousand of them must not stay in memory.
And `decide` only reads them: what it decoded comes back in `Decided.read`, for the caller to keep."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from pubsub_filter.core.compare import fields, routes
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.judge import Decided, decide
from pubsub_filter.core.engine.transitions import forwarded
from pubsub_filter.core.model import Decision, KeyState, Message

ROUTE = {
    "name": "props",
    "destination": "phase3",
    "key": ["payload.game_id"],
    "rows": "payload.props",
    "row_key": ["player"],
    "tolerance": {"price": 12},
}


def rules() -> RouteRules:
    return RouteRules(parse({"routes": [ROUTE]}).routes[0])


def test_large_stored_states_are_kept_decoded_up_to_the_byte_bound_newest_first() -> None:
    route = rules()
    blobs = [bytes([n]) * 900_000 for n in range(40)]
    for blob in blobs:
        route.keep_reference(blob, None)
    kept = [blob for blob in blobs if blob in route._references]
    assert sum(map(len, kept)) <= routes._KEPT_BYTES
    assert kept == blobs[-len(kept) :] and len(kept) == routes._KEPT_BYTES // 900_000


def test_small_stored_states_are_kept_up_to_the_count_bound() -> None:
    route = rules()
    for n in range(routes._KEPT_STATES + 10):
        route.keep_fields_state(n.to_bytes(4, "big"), {})  # type: ignore[arg-type]
    assert len(route._befores) == routes._KEPT_STATES
    assert (routes._KEPT_STATES + 9).to_bytes(4, "big") in route._befores


# --- `decide` reads the caches and writes none: what it decoded comes back to be kept ---------


def _rules(**route: Any) -> RouteRules:
    return RouteRules(parse({"routes": [{"name": "r", "destination": "out", "key": ["payload.k"], **route}]}).routes[0])


def _stored(rules: RouteRules, payload: dict[str, Any]) -> KeyState:
    """The state a forward of `payload` commits, written by another process (none of it kept here)."""
    data = json.dumps(payload).encode()
    decoded, fp = rules.scheme(data)
    d = decide(rules, Message(data, {}, "m0"), fp, None, 0.0, False, random.Random(0), decoded)
    return forwarded(None, Message(data, {}, "m0"), fp, 1, d.out, 0.0, 1e12)


def _decide(rules: RouteRules, payload: dict[str, Any], state: KeyState) -> Decided:
    data = json.dumps(payload).encode()
    decoded, fp = rules.scheme(data)
    return decide(rules, Message(data, {}, "m1"), fp, state, 1.0, False, random.Random(0), decoded)


def _caches(rules: RouteRules) -> tuple[dict[Any, Any], ...]:
    return dict(rules._befores), dict(rules._references), dict(rules.looks)


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[bytes]:
    calls: list[bytes] = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda blob: calls.append(blob) or real(blob))
    return calls


def test_a_suppression_decodes_the_stored_field_state_once_and_leaves_it_to_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rules = _rules(exclude=["scraped_at"], tolerance={"price": 1})
    state = _stored(rules, {"k": 1, "price": 10, "scraped_at": 1})
    decoded = _counting(monkeypatch, fields, "decode")
    read = _counting(monkeypatch, routes, "read")
    first = _decide(rules, {"k": 1, "price": 10, "scraped_at": 2}, state)  # excluded changed: suppressed
    within = _decide(rules, {"k": 1, "price": 10.5, "scraped_at": 2}, state)  # within tolerance: suppressed
    assert (first.verdict.decision, within.verdict.decision) == (Decision.SUPPRESSED, Decision.SUPPRESSED)
    assert _caches(rules) == ({}, {}, {}), "decide wrote none of the route's caches"
    assert first.read is not None and first.read.fields_state is not None and first.read.blob == state.rows
    assert within.read is not None and within.read.reference_read and within.read.reference is not None
    rules.keep_read(first.read)
    rules.keep_read(within.read)
    decoded.clear(), read.clear()
    again = _decide(rules, {"k": 1, "price": 10.5, "scraped_at": 3}, state)
    assert again.verdict.decision is Decision.SUPPRESSED and again.details == within.details
    assert (again.read, decoded, read) == (None, [], []), "kept: the next decision decodes nothing"


def test_a_look_at_state_another_selection_stored_is_kept_by_the_caller_not_by_decide() -> None:
    before = _rules(exclude=[])
    state = _stored(before, {"k": 1, "a": 1, "scraped_at": 1})
    rules = _rules(exclude=["scraped_at"])  # a deploy added an exclude: the stored selection is another
    first = _decide(rules, {"k": 1, "a": 1, "scraped_at": 2}, state)
    assert first.verdict.decision is Decision.SUPPRESSED and _caches(rules) == ({}, {}, {})
    assert first.read is not None and first.read.look is not None
    rules.keep_read(first.read)
    assert list(rules.looks) == [first.read.look[0]]
    again = _decide(rules, {"k": 1, "a": 1, "scraped_at": 2}, state)
    assert again.read is None and again.verdict == first.verdict
