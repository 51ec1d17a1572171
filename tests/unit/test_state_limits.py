"""The state limit (`rows.MAX_STORED_BYTES`, 900,000 bytes: one limit on a key's stored state,
whatever it holds) said out loud, and nothing switched off silently below it.

- A whole-payload route tracks every top-level field (there is no count of fields past which
  tolerance and flags stop: 600 fields decide as 6 do). Past the limit the record says so
  (`fields_state`), the tolerance reference is kept alone, and the tolerance still applies.
- A rows route whose tolerance reference does not fit flags what the row digests say changed,
  as the same route without tolerance does (never every field for a change to one).
- Past the row-state limit the record says which limit and what the key falls back to, never
  that rows are not objects or share a key, with or without a tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.compare import rows
from pubsub_filter.core.model import Message
from tests.support.push_client import engine_on_sqlite

WHOLE = {
    "name": "totals",
    "destination": "phase3",
    "key": ["payload.k"],
    "tolerance": {"p": 5},
    "changed_attributes": ["p", "s"],
}
ROWS = {
    "name": "props",
    "destination": "phase3",
    "key": ["payload.k"],
    "rows": "payload.rows",
    "row_key": ["id"],
    "include": ["id", "p", "s"],
    "changed_attributes": ["p", "s"],
}


async def decide(tmp_path: Path, route: dict[str, Any], payloads: list[Any]) -> list[tuple[str, str, Any, Any]]:
    """(decision, reason, the flags a forward carried, the record's details) per payload."""
    engine = engine_on_sqlite(tmp_path, {"routes": [route]})
    publisher: Any = engine.publisher
    out = []
    try:
        for n, payload in enumerate(payloads):
            msg = Message(data=json.dumps(payload).encode(), attributes={}, message_id=f"m{n}")
            rec = (await engine.handle(route["name"], msg)).record
            flags = None
            if str(rec.decision) == "forwarded":
                attributes = publisher.published[-1].attributes
                flags = {k.removeprefix("filter_changed_") for k in attributes if k.startswith("filter_changed_")}
            out.append((str(rec.decision), rec.reason, flags, dict(rec.details)))
    finally:
        await engine.store.close()
    return out


def many(p: int, s: str, fields: int = 600) -> dict[str, Any]:
    return {"k": 1, "p": p, "s": s, **{f"f{i}": i for i in range(fields)}}


async def test_a_payload_of_600_fields_keeps_its_tolerance_and_flags(tmp_path: Path) -> None:
    found = await decide(tmp_path, WHOLE, [many(100, "a"), many(103, "a"), many(103, "b"), many(200, "b")])
    assert [(d, r, f) for d, r, f, _ in found] == [
        ("forwarded", "new key", {"p", "s"}),
        ("suppressed", "moved within tolerance", None),
        ("forwarded", "content changed", {"s"}),
        ("forwarded", "content changed", {"p"}),
    ]
    assert all("fields_state" not in details for *_, details in found)


async def test_past_the_state_limit_a_whole_payload_keeps_its_tolerance_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rows, "MAX_STORED_BYTES", 2000)  # the field state of 600 fields does not fit
    found = await decide(
        tmp_path, WHOLE, [many(100, "a"), many(103, "a"), many(110, "a"), many(110, "b"), many(114, "b")]
    )
    assert [(d, r, f) for d, r, f, _ in found] == [
        ("forwarded", "new key", {"p", "s"}),
        ("suppressed", "moved within tolerance", None),  # the reference alone was kept
        ("forwarded", "content changed", {"p"}),  # its rest digest: nothing else changed
        ("forwarded", "content changed", {"s"}),  # something else did; p did not move
        ("suppressed", "moved within tolerance", None),
    ]
    first = found[0][3]
    assert first["fields_state"].startswith("too large to keep (past the state limit of 900,000 bytes)")
    assert "tolerance_state" not in first
    assert found[2][3]["fields_changed"] is None  # said unknown, never guessed


def props(p: int, n: int = 40) -> dict[str, Any]:
    return {"k": 1, "rows": [{"id": i, "p": p if i == 0 else 1, "s": "x"} for i in range(n)]}


@pytest.mark.parametrize("tolerance", [{"p": 5}, {}], ids=["tolerance", "flags only"])
async def test_a_reference_that_does_not_fit_flags_what_the_row_digests_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tolerance: dict[str, int]
) -> None:
    route = {**ROWS, "tolerance": tolerance}
    state = rows.encode(
        rows.digest_rows(
            __import__("pubsub_filter.core.config.schema", fromlist=["Route"]).Route.model_validate(route),
            props(100)["rows"],
        )
    )
    assert state is not None
    monkeypatch.setattr(rows, "MAX_STORED_BYTES", len(state) + 8)  # the row state fits, a reference not
    found = await decide(tmp_path, route, [props(100), props(200)])
    assert [(d, f) for d, _, f, _ in found] == [("forwarded", {"p", "s"}), ("forwarded", {"p"})]


@pytest.mark.parametrize("tolerance", [{"p": 5}, {}], ids=["tolerance", "flags only"])
@pytest.mark.parametrize("include", [["id", "p", "s"], []], ids=["typed", "generic"])
async def test_past_the_row_state_limit_the_record_says_which_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tolerance: dict[str, int], include: list[str]
) -> None:
    monkeypatch.setattr(rows, "MAX_STORED_BYTES", 1000)
    found = await decide(tmp_path, {**ROWS, "include": include, "tolerance": tolerance}, [props(100), props(200)])
    for decision, _, flags, details in found:
        assert decision == "forwarded" and flags == {"p", "s"}  # nothing stored to compare with
        assert details["rows_state"].startswith("too large to keep (past the state limit of 900,000 bytes)")
        assert "compared as a whole payload" in details["rows_state"]
        assert "not matched by key" not in details.get("tolerance_state", "")
        assert ("tolerance_state" in details) is bool(tolerance)
