"""The BigQuery decisions table against a real bqemulator (started once per session)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from google.cloud import bigquery

from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.backends.records.bigquery import (
    EMULATOR_ENV,
    SCHEMA,
    BigQueryReader,
    BigQuerySink,
    bigquery_reader,
    bigquery_recorder,
    make_client,
)
from pubsub_filter.core.config.schema import BigqueryRecordsConfig
from pubsub_filter.core.model import Decision, DecisionRecord
from tests.support.bqemu import BqEmulator, free_port
from tests.support.polling import eventually

pytestmark = pytest.mark.emulator

PROJECT = "test-project"


@pytest.fixture
def bq_env(bq_emulator: BqEmulator, monkeypatch: pytest.MonkeyPatch) -> BqEmulator:
    monkeypatch.setenv(EMULATOR_ENV, bq_emulator.host)
    return bq_emulator


@pytest.fixture
def table_id(bq_env: BqEmulator) -> Iterator[str]:
    dataset = f"t_{uuid.uuid4().hex[:12]}"
    yield f"{PROJECT}.{dataset}.decisions"
    client = bq_env.client()
    client.delete_dataset(f"{PROJECT}.{dataset}", delete_contents=True, not_found_ok=True)
    client.close()


@pytest.fixture
def sink(table_id: str) -> BigQuerySink:
    return BigQuerySink(make_client(PROJECT), table_id, partition_expiration_days=7, deadline=10)


@pytest.fixture
def reader(table_id: str) -> Iterator[BigQueryReader]:
    reader = BigQueryReader(make_client(PROJECT), table_id)
    yield reader
    reader.close()


class CountingSink:
    """Wraps the real sink to count (and optionally hold up) the insert calls."""

    def __init__(self, inner: BigQuerySink) -> None:
        self.inner = inner
        self.name = inner.name
        self.sizes: list[int] = []
        self.wrote = asyncio.Event()

    async def write(self, rows: list[DecisionRecord]) -> None:
        await self.inner.write(rows)
        self.sizes.append(len(rows))
        self.wrote.set()

    async def close(self) -> None:
        await self.inner.close()


def now_rec(i: int, *, route: str = "injuries", **kw: Any) -> DecisionRecord:
    fields: dict[str, Any] = dict(
        time=time.time(), route=route, decision=Decision.FORWARDED, enforced=True, message_id=f"m{i}"
    )
    fields.update(kw)
    return DecisionRecord(**fields)


def select(client: bigquery.Client, sql: str) -> list[dict[str, Any]]:
    return [dict(row.items()) for row in client.query(sql).result()]


# --- the table ---------------------------------------------------------------------


def test_ensure_table_creates_partitioned_clustered_expiring_table(sink: BigQuerySink) -> None:
    sink.ensure_table()
    sink.ensure_table()  # idempotent: it exists now
    table = sink.client.get_table(sink.table)
    assert table.time_partitioning is not None
    assert table.time_partitioning.type_ == bigquery.TimePartitioningType.DAY
    assert table.time_partitioning.field == "time"
    assert table.time_partitioning.expiration_ms == 7 * 86_400_000
    assert table.clustering_fields == ["route", "decision"]
    got = [(f.name, f.field_type, f.mode) for f in table.schema]
    assert got == [(f.name, f.field_type, f.mode) for f in SCHEMA]
    assert ("time", "TIMESTAMP", "REQUIRED") in got and ("extra", "JSON", "NULLABLE") in got


async def test_factory_builds_recorder_from_config(bq_env: BqEmulator) -> None:
    dataset = f"t_{uuid.uuid4().hex[:12]}"
    cfg = BigqueryRecordsConfig(
        backend="bigquery", dataset=dataset, partition_expiration_days=30, batch_size=7, flush_interval=2
    )
    recorder = bigquery_recorder(cfg, PROJECT)
    assert isinstance(recorder.sink, BigQuerySink)
    assert recorder.sink.table == f"{PROJECT}.{dataset}.decisions"
    assert (recorder.batch_size, recorder.flush_interval, recorder.max_buffer) == (7, 2.0, 50_000)
    recorder.record(now_rec(1))  # the table is created on the first write
    await recorder.close()
    assert recorder.written == 1
    client = bq_env.client()
    table = client.get_table(f"{PROJECT}.{dataset}.decisions")
    assert table.time_partitioning.expiration_ms == 30 * 86_400_000
    client.delete_dataset(f"{PROJECT}.{dataset}", delete_contents=True)
    client.close()


# --- writing -------------------------------------------------------------------------


async def test_rows_are_written_in_batches_and_read_back(sink: BigQuerySink) -> None:
    counting = CountingSink(sink)
    recorder = BatchingRecorder(counting, batch_size=10, flush_interval=3600)
    t0 = time.time()
    for i in range(25):
        recorder.record(
            now_rec(
                i,
                time=t0 + i / 1000,
                key=f"player-{i % 3}",
                fingerprint="sha256:" + "a" * 64,
                fence=i,
                publish_time=t0 - 1,
                latency_ms=1.25,
                details={"scheme": "canonical", "n": i},
                trace="projects/p/traces/abc",
            )
        )
    while len(counting.sizes) < 2:  # the two full batches go out on their own
        await asyncio.wait_for(counting.wrote.wait(), timeout=30)
        counting.wrote.clear()
    assert counting.sizes == [10, 10] and recorder.pending == 5
    await recorder.close()
    assert counting.sizes == [10, 10, 5]
    assert recorder.written == 25 and recorder.dropped == 0

    client = make_client(PROJECT)
    rows = select(client, f"SELECT * FROM `{sink.table}` ORDER BY fence")
    assert [r["message_id"] for r in rows] == [f"m{i}" for i in range(25)]
    first = rows[3]
    assert first["route"] == "injuries" and first["decision"] == "forwarded" and first["enforced"] is True
    assert first["key"] == "player-0" and first["fence"] == 3 and first["latency_ms"] == 1.25
    assert abs(first["time"].timestamp() - (t0 + 0.003)) < 1e-5
    assert abs(first["publish_time"].timestamp() - (t0 - 1)) < 1e-5
    extra = first["extra"] if isinstance(first["extra"], dict) else json.loads(first["extra"])
    assert extra == {"scheme": "canonical", "n": 3}
    assert first["trace"] == "projects/p/traces/abc"
    client.close()


async def test_close_flushes_everything_waiting(sink: BigQuerySink) -> None:
    recorder = BatchingRecorder(sink, batch_size=1000, flush_interval=3600)
    for i in range(37):
        recorder.record(now_rec(i, decision=Decision.SUPPRESSED, enforced=False))
    assert recorder.pending == 37  # neither threshold reached
    await recorder.close()
    client = make_client(PROJECT)
    rows = select(client, f"SELECT COUNT(*) AS n, COUNTIF(decision = 'suppressed') AS s FROM `{sink.table}`")
    assert rows == [{"n": 37, "s": 37}]
    client.close()


async def test_unreachable_bigquery_never_blocks_or_raises(
    monkeypatch: pytest.MonkeyPatch, bq_emulator: BqEmulator
) -> None:
    # nothing listens on this port: every call fails with connection refused
    monkeypatch.setenv(EMULATOR_ENV, f"http://127.0.0.1:{free_port()}")
    dead = BigQuerySink(make_client(PROJECT), f"{PROJECT}.nowhere.decisions", deadline=0.3, timeout=0.3)
    recorder = BatchingRecorder(dead, batch_size=100, max_buffer=1000, retry_attempts=2, retry_backoff=0)

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    tick_task = asyncio.create_task(ticker())
    for i in range(100):
        recorder.record(now_rec(i))  # one full batch: the writer takes it to the dead sink
    await eventually(lambda: recorder.pending == 0, 10, "the writer never took the batch")
    assert recorder.pending == 0 and recorder.written == 0

    before = ticks
    for i in range(100, 10_100):
        recorder.record(now_rec(i))
    # the event loop did not turn once during 10k records: record() never awaited
    assert ticks == before
    assert recorder.pending == 1000, "bounded at max_buffer while the sink is down"
    assert recorder.dropped >= 9000

    started = time.monotonic()
    await recorder.close()  # must not raise; every batch fails after its bounded retries
    tick_task.cancel()
    assert time.monotonic() - started < 60, "the sink's deadline bounds each attempt"
    assert recorder.written == 0
    assert recorder.failed_batches == 1 + 1000 // 100
    assert recorder.dropped == 10_100


async def test_raising_sink_is_counted_not_raised(sink: BigQuerySink) -> None:
    class Broken(CountingSink):
        async def write(self, rows: list[DecisionRecord]) -> None:
            raise RuntimeError("quota exceeded")

    recorder = BatchingRecorder(Broken(sink), batch_size=5, retry_attempts=3, retry_backoff=0)
    for i in range(12):
        recorder.record(now_rec(i))
    await recorder.close()
    assert recorder.failed_batches == 3 and recorder.dropped == 12 and recorder.written == 0


# --- reading back: skip rate ----------------------------------------------------------


def _known_records(day0: dt.datetime) -> list[DecisionRecord]:
    """Two routes over two days and three hours, decisions and enforcement mixed."""
    spec = [
        # (route, day offset, hour, minute, decision, enforced, count)
        ("injuries", 0, 10, 5, Decision.FORWARDED, True, 3),
        ("injuries", 0, 10, 55, Decision.SUPPRESSED, True, 5),
        ("injuries", 0, 11, 0, Decision.SUPPRESSED, True, 2),
        ("injuries", 1, 9, 30, Decision.DUPLICATE, True, 1),
        ("injuries", 1, 9, 31, Decision.SUPPRESSED, False, 4),
        ("odds", 0, 10, 20, Decision.FORWARDED, False, 2),
        ("odds", 1, 23, 59, Decision.FAIL_OPEN, True, 6),
    ]
    out = []
    n = 0
    for route, day, hour, minute, decision, enforced, count in spec:
        at = day0 + dt.timedelta(days=day, hours=hour, minutes=minute)
        for j in range(count):
            n += 1
            out.append(
                DecisionRecord(
                    time=at.timestamp() + j,
                    route=route,
                    decision=decision,
                    enforced=enforced,
                    message_id=f"k{n}",
                )
            )
    return out


def _expected(records: list[DecisionRecord], by: str, since: float | None = None) -> list[dict[str, Any]]:
    def bucket(t: float) -> str | None:
        at = dt.datetime.fromtimestamp(t, dt.UTC)
        if by == "hour":
            return at.strftime("%Y-%m-%dT%H:00:00Z")
        if by == "day":
            return at.strftime("%Y-%m-%d")
        return None

    counts = Counter(
        (r.route, bucket(r.time), str(r.decision), r.enforced) for r in records if since is None or r.time >= since
    )
    return [
        {"route": route, "bucket": b, "decision": d, "enforced": e, "n": n} for (route, b, d, e), n in counts.items()
    ]


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["route"], row["bucket"] or "", row["decision"], row["enforced"])


async def test_decision_counts_group_by_route_hour_day(sink: BigQuerySink, reader: BigQueryReader) -> None:
    today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    day0 = today - dt.timedelta(days=2)  # recent: inside the partition expiry
    records = _known_records(day0)
    await sink.write(records)

    for by in ("route", "hour", "day"):
        got = reader.decision_counts(None, by)
        assert sorted(got, key=_key) == sorted(_expected(records, by), key=_key), by
        assert all(set(row) == {"route", "bucket", "decision", "enforced", "n"} for row in got)

    by_route = {(r["route"], r["decision"], r["enforced"]): r["n"] for r in reader.decision_counts(None, "route")}
    assert by_route[("injuries", "suppressed", True)] == 7
    assert by_route[("injuries", "suppressed", False)] == 4

    hours = reader.decision_counts(None, "hour")
    assert {
        "route": "injuries",
        "bucket": day0.strftime("%Y-%m-%dT10:00:00Z"),
        "decision": "suppressed",
        "enforced": True,
        "n": 5,
    } in hours

    # `since` cuts at a timestamp
    since = (day0 + dt.timedelta(days=1)).timestamp()
    got = reader.decision_counts(since, "day")
    assert sorted(got, key=_key) == sorted(_expected(records, "day", since), key=_key)
    assert {r["bucket"] for r in got} == {(day0 + dt.timedelta(days=1)).strftime("%Y-%m-%d")}

    with pytest.raises(ValueError):
        reader.decision_counts(None, "week")  # type: ignore[arg-type]


def test_reader_factory_reads_the_configured_table(sink: BigQuerySink) -> None:
    project, dataset, table = sink.table.split(".")
    reader = bigquery_reader(BigqueryRecordsConfig(backend="bigquery", dataset=dataset, table=table), project)
    try:
        assert reader.table == sink.table
        sink.ensure_table()
        assert reader.decision_counts(None, "route") == []
    finally:
        reader.close()
