"""A payload holding a number beyond double range (`1e400`: valid JSON) is decided like any other.

Its fingerprint stays the one over its bytes (the golden vector `number/1e400-raw`, and
`payload_kind: raw` in the record), but the decision reads it: the key, bypass rules, fields,
rows and tolerance find their values, the number itself as its exact decimal. So a repeat is
suppressed, a move within tolerance is held back and the flags say what changed, where before
every such message was forwarded `fail_open` ("payload is not JSON") and never deduplicated.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from pubsub_filter.core.compare.fingerprint import NOT_JSON, compile_scheme, raw_fingerprint
from pubsub_filter.core.config.schema import Route
from pubsub_filter.core.model import Message
from tests.support.push_client import engine_on_sqlite

WHOLE = {
    "name": "totals",
    "destination": "phase3",
    "key": ["payload.k"],
    "tolerance": {"p": 5},
    "changed_attributes": ["p", "q"],
}
ROWS = {
    "name": "props",
    "destination": "phase3",
    "key": ["payload.k"],
    "rows": "payload.rows",
    "row_key": ["id"],
    "changed_attributes": ["v", "w"],
}


async def decide(tmp_path: Path, route: dict[str, Any], bodies: list[bytes]) -> list[tuple[str, str, Any, Any]]:
    engine = engine_on_sqlite(tmp_path, {"routes": [route]})
    publisher: Any = engine.publisher
    out = []
    try:
        for n, data in enumerate(bodies):
            handled = await engine.handle(route["name"], Message(data=data, attributes={}, message_id=f"m{n}"))
            rec = handled.record
            flags = None
            if str(rec.decision) == "forwarded":
                flags = sorted(k for k in publisher.published[-1].attributes if k.startswith("filter_changed_"))
            out.append((str(rec.decision), rec.reason, rec.details.get("payload_kind"), flags))
    finally:
        await engine.store.close()
    return out


async def test_a_whole_payload_with_one_is_keyed_deduplicated_and_compared_within_tolerance(tmp_path: Path) -> None:
    bodies = [
        b'{"k": 1, "p": 100, "q": 1e400}',
        b'{"k": 1, "p": 100, "q": 1e400}',  # the same bytes, another message: a repeat
        b'{"k": 1, "p": 103, "q": 1e400}',  # p within 5 of the last forward
        b'{"k": 1, "p": 103, "q": 2e400}',  # q changed
        b'{"k": 1, "p": 103, "q": 20e399}',  # the same values, spelled otherwise: other bytes
    ]
    assert await decide(tmp_path, WHOLE, bodies) == [
        ("forwarded", "new key", "raw", ["filter_changed_p", "filter_changed_q"]),
        ("suppressed", "unchanged since last forward", "raw", None),
        ("suppressed", "moved within tolerance", "raw", None),
        ("forwarded", "content changed", "raw", ["filter_changed_q"]),
        ("suppressed", "moved within tolerance", "raw", None),  # nothing moved: no value changed
    ]


async def test_a_rows_payload_with_one_keeps_its_row_state(tmp_path: Path) -> None:
    bodies = [
        b'{"k": "g", "rows": [{"id": 1, "v": 1e400, "w": 1}, {"id": 2, "v": 2, "w": 1}]}',
        b'{"k": "g", "rows": [{"id": 1, "v": 1e400, "w": 1}, {"id": 2, "v": 2, "w": 1}]}',
        b'{"k": "g", "rows": [{"id": 1, "v": 1e400, "w": 2}, {"id": 2, "v": 2, "w": 1}]}',
    ]
    assert await decide(tmp_path, ROWS, bodies) == [
        ("forwarded", "new key", "raw", ["filter_changed_v", "filter_changed_w"]),
        ("suppressed", "unchanged since last forward", "raw", None),
        ("forwarded", "content changed", "raw", ["filter_changed_w"]),
    ]


async def test_a_key_beyond_double_range_is_its_exact_decimal(tmp_path: Path) -> None:
    bodies = [b'{"k": 1e400, "p": 1}', b'{"k": 10e399, "p": 1}', b'{"k": 1e401, "p": 1}']
    engine = engine_on_sqlite(tmp_path, {"routes": [{**WHOLE, "tolerance": {}, "changed_attributes": []}]})
    keys = []
    try:
        for n, data in enumerate(bodies):
            keys.append(
                (await engine.handle("totals", Message(data=data, attributes={}, message_id=str(n)))).record.key
            )
    finally:
        await engine.store.close()
    assert keys == ["1E+400", "1E+400", "1E+401"]


def test_the_fingerprint_stays_over_the_bytes_and_the_payload_is_read_as_decimals() -> None:
    from pubsub_filter.core.compare.canonical import wide_number

    scheme = compile_scheme(Route.model_validate(WHOLE))
    data = b'{"k": 1, "v": 1e400, "w": -12.50e-400, "x": 2.5}'
    assert scheme(data) == (NOT_JSON, raw_fingerprint(data))
    assert scheme.readable(data) == {"k": 1, "v": Decimal("1e400"), "w": 0, "x": 2.5}
    assert scheme.readable(b"not json") is NOT_JSON
    assert str(wide_number("1230000e400")) == "1.23E+406" and wide_number("-0e999") == 0


async def test_in_a_field_the_route_leaves_out_it_does_not_count(tmp_path: Path) -> None:
    # an excluded field (a scrape time, say) beyond double range: by value, so noise is noise
    route = {**WHOLE, "exclude": ["noise"], "tolerance": {}, "changed_attributes": []}
    bodies = [
        b'{"k": 1, "p": 100, "noise": 1e400}',
        b'{"k": 1, "p": 100, "noise": 2e400}',
        b'{"p": 100, "k": 1, "noise": 3}',
        b'{"k": 1, "p": 101, "noise": 4e400}',
    ]
    assert [(d, r, kind) for d, r, kind, _ in await decide(tmp_path, route, bodies)] == [
        ("forwarded", "new key", None),
        ("suppressed", "unchanged since last forward", None),
        ("suppressed", "unchanged since last forward", None),
        ("forwarded", "content changed", None),
    ]
    scheme = compile_scheme(Route.model_validate(route))
    assert scheme(bodies[0])[1] == scheme(b'{"k":1,"p":100}')[1]  # the canonical fingerprint, by value


async def test_a_changed_rows_forward_sends_such_a_number_as_it_was(tmp_path: Path) -> None:
    route = {**ROWS, "rows_mode": "changed", "removed_rows": "tombstone", "changed_attributes": []}
    bodies = [
        b'{"k": "g", "at": 1e400, "rows": [{"id": 1, "v": 1, "w": 1}, {"id": 2, "v": 2, "w": 1}]}',
        b'{"k": "g", "at": 2e400, "rows": [{"id": 1, "v": 1e400, "w": 1}, {"id": 3, "v": 2, "w": 1}]}',
    ]
    engine = engine_on_sqlite(tmp_path, {"routes": [route]})
    publisher: Any = engine.publisher
    try:
        for n, data in enumerate(bodies):
            rec = (await engine.handle("props", Message(data=data, attributes={}, message_id=str(n)))).record
            assert str(rec.decision) == "forwarded", rec.reason
    finally:
        await engine.store.close()
    sent = publisher.published[-1].data
    assert sent == (
        b'{"k":"g","at":2E+400,"rows":[{"id":1,"v":1E+400,"w":1},{"id":3,"v":2,"w":1},{"id":2,"filter_removed":true}]}'
    )
