"""Row state users have stored diffs correctly against tomorrow's messages.

tests/golden/row_state.json was written by the code before the row-state speed-ups: per case, a
route, the row state that code stored for a first report, a second report, and what that code
decided for it (the row state written back, the data and attributes published, the record's row
details). The second report changes a field, adds a field to a row, reorders a nested object
(same content), removes a row, adds one, changes a field outside the selection, and brings a
field no stored row has (the stored layout changes). A difference is a breaking change for
stored state: fix the code, do not edit the file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.judge import decide
from pubsub_filter.core.model import KeyState, Message

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "row_state.json"
CASES: list[dict[str, Any]] = json.loads(GOLDEN.read_text(encoding="utf-8"))["cases"]


def forward(case: dict[str, Any], seen_by_fingerprint: bool) -> Any:
    rules = RouteRules(parse({"routes": [case["route"]]}).routes[0])
    data = case["message"].encode()
    expected = case["expected"]
    fp = expected["fingerprint"]
    typed = None
    if seen_by_fingerprint:
        _, seen, typed = rules.scheme.with_rows(data)  # as a forward does: the fingerprint decodes the rows first
        assert seen == fp and typed is not None
    state = KeyState(
        fingerprint=expected["stored_fingerprint"],
        forwarded_at=10.0,
        message_id="m1",
        publish_time=1.0,
        rows=case["stored_rows"].encode(),
    )
    # a row-mode route reads its rows (the fingerprint's, or `typed_rows`), not the decoded payload: none is given
    msg = Message(data, {}, "m2", publish_time=2.0)
    return decide(rules, msg, fp, state, 20.0, False, random.Random(0), None, typed)


@pytest.mark.parametrize("seen_by_fingerprint", [True, False], ids=["rows-kept", "rows-decoded"])
@pytest.mark.parametrize("case", CASES, ids=[c["route"]["rows_mode"] for c in CASES])
def test_stored_row_state_of_the_previous_code_is_written_back_byte_identical(
    case: dict[str, Any], seen_by_fingerprint: bool
) -> None:
    out = forward(case, seen_by_fingerprint).out
    assert out.rows is not None and out.rows.decode() == case["expected"]["rows"]


@pytest.mark.parametrize("seen_by_fingerprint", [True, False], ids=["rows-kept", "rows-decoded"])
@pytest.mark.parametrize("case", CASES, ids=[c["route"]["rows_mode"] for c in CASES])
def test_stored_row_state_of_the_previous_code_gives_the_same_publish_and_record(
    case: dict[str, Any], seen_by_fingerprint: bool
) -> None:
    decided = forward(case, seen_by_fingerprint)
    assert decided.out.data.decode() == case["expected"]["data"]
    assert decided.out.attributes == case["expected"]["attributes"]
    details = dict(decided.details)
    # added after the vectors were written, for `tune`: the fields that changed in any row
    fields_changed = details.pop("fields_changed")
    assert details == case["expected"]["details"]
    changes = case["expected"]["details"].get("changes", [])
    assert fields_changed == sorted({f for change in changes for f in change.get("fields", [])})
