"""skip-rate's BigQuery reader counts suppressions within tolerance, and decisions under a changed
selection, under their own names (bqemulator)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from pubsub_filter.backends.records.bigquery import EMULATOR_ENV, BigQueryReader, BigQuerySink, make_client
from pubsub_filter.core.model import Decision, DecisionRecord
from tests.support.bqemu import BqEmulator

pytestmark = pytest.mark.emulator

PROJECT = "test-project"


@pytest.fixture
def table_id(bq_emulator: BqEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv(EMULATOR_ENV, bq_emulator.host)
    dataset = f"t_{uuid.uuid4().hex[:12]}"
    yield f"{PROJECT}.{dataset}.decisions"
    client = bq_emulator.client()
    client.delete_dataset(f"{PROJECT}.{dataset}", delete_contents=True, not_found_ok=True)
    client.close()


async def test_the_bigquery_reader_counts_suppressions_within_tolerance_by_name(table_id: str) -> None:
    now = time.time()

    def rec(decision: Decision, reason: str) -> DecisionRecord:
        return DecisionRecord(now, "odds", decision, True, uuid.uuid4().hex, key="g1", reason=reason)

    sink = BigQuerySink(make_client(PROJECT), table_id, partition_expiration_days=7, deadline=10)
    await sink.write(
        [
            rec(Decision.FORWARDED, "new key"),
            rec(Decision.SUPPRESSED, "moved within tolerance"),
            rec(Decision.SUPPRESSED, "moved within tolerance; the message id was reused with other content"),
            rec(Decision.SUPPRESSED, "unchanged since last forward"),
        ]
    )
    await sink.close()
    reader = BigQueryReader(make_client(PROJECT), table_id)
    try:
        counts = {r["decision"]: r["n"] for r in reader.decision_counts(None, "route")}
    finally:
        reader.close()
    assert counts == {"forwarded": 1, "suppressed": 1, "within_tolerance": 2}


async def test_the_bigquery_reader_counts_decisions_under_a_changed_selection_apart(table_id: str) -> None:
    now = time.time()

    def rec(decision: Decision, reason: str) -> DecisionRecord:
        return DecisionRecord(now, "odds", decision, True, uuid.uuid4().hex, key="g1", reason=reason)

    sink = BigQuerySink(make_client(PROJECT), table_id, partition_expiration_days=7, deadline=10)
    await sink.write(
        [
            rec(Decision.FORWARDED, "content changed"),
            rec(Decision.FORWARDED, "selection changed (exclude +note): changed: v"),
            rec(Decision.SUPPRESSED, "selection changed (exclude +note): unchanged as the new selection compares it"),
            rec(Decision.SUPPRESSED, "selection changed (exclude +note): unchanged as the new selection compares it"),
            rec(Decision.SUPPRESSED, "unchanged since last forward"),
        ]
    )
    await sink.close()
    reader = BigQueryReader(make_client(PROJECT), table_id)
    try:
        counts = {r["decision"]: r["n"] for r in reader.decision_counts(None, "route")}
    finally:
        reader.close()
    assert counts == {"forwarded": 1, "selection_forwarded": 1, "suppressed": 1, "selection_suppressed": 2}


async def test_the_bigquery_reader_counts_the_keys_a_route_forwarded_for_plan(table_id: str) -> None:
    now = time.time()

    def rec(key: str, decision: Decision, at: float) -> DecisionRecord:
        return DecisionRecord(at, "odds", decision, True, uuid.uuid4().hex, key=key, reason="x")

    sink = BigQuerySink(make_client(PROJECT), table_id, partition_expiration_days=7, deadline=10)
    await sink.write(
        [
            rec("g1", Decision.FORWARDED, now),
            rec("g1", Decision.FORWARDED, now),
            rec("g2", Decision.FORWARDED, now),
            rec("g3", Decision.SUPPRESSED, now),
            rec("g4", Decision.FORWARDED, now - 86400 * 3),
        ]
    )
    await sink.close()
    reader = BigQueryReader(make_client(PROJECT), table_id)
    try:
        assert reader.keys_forwarded("odds", now - 86400) == 2
        assert reader.keys_forwarded("odds", None) == 3
        assert reader.keys_forwarded("other", None) == 0
    finally:
        reader.close()
