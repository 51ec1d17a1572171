"""A route's decoded stored states are bounded in bytes as well as in number: a rows route's
state can near the row-state cap (~900 KB), and a thousand of them must not stay in memory."""

from __future__ import annotations

from pubsub_filter.core.compare import routes
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import parse

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
