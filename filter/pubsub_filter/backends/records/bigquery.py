"""The BigQuery decisions table: a batch sink, its table definition, and its `RecordsReader`.

The table is partitioned by day on `time` (partitions expire after
`partition_expiration_days`) and clustered by route and decision, so the skip-rate query
over a few days reads a few partitions. Terraform normally creates it; `ensure_table()`
creates it when it is missing (needs only `tables.get` when it exists).

Against an emulator set `BIGQUERY_EMULATOR_HOST=http://127.0.0.1:PORT`: the client then
uses anonymous credentials and that endpoint.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import os
from typing import Any

from google.api_core.client_options import ClientOptions
from google.api_core.exceptions import NotFound
from google.api_core.retry import Retry
from google.auth.credentials import AnonymousCredentials

from pubsub_filter.backends import extras

try:  # the `bigquery` extra: a bare install has no BigQuery client
    from google.cloud import bigquery
    from google.cloud.bigquery.retry import DEFAULT_RETRY
except ImportError as exc:
    raise extras.import_error(extras.BIGQUERY, exc) from exc

from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.backends.records.extra import encode_extra
from pubsub_filter.core.compare.selection import FORWARDED_LABEL, SELECTION_CHANGED, SUPPRESSED_LABEL
from pubsub_filter.core.compare.tolerance import WITHIN, WITHIN_TOLERANCE
from pubsub_filter.core.config.schema import BigqueryRecordsConfig
from pubsub_filter.core.errors import FilterError
from pubsub_filter.core.escaped import text
from pubsub_filter.core.model import COLUMN_NAMES, DECISION_COLUMNS, Column, DecisionRecord
from pubsub_filter.core.ports import Bucket, DecisionCount, DecisionRow

EMULATOR_ENV = "BIGQUERY_EMULATOR_HOST"

_TYPES = {"time": "TIMESTAMP", "text": "STRING", "bool": "BOOL", "int": "INT64", "float": "FLOAT64", "json": "JSON"}
# Tables already deployed (and infra's decisions_schema.json) declare `enforced` NULLABLE;
# a new table declaring it REQUIRED would no longer match what Terraform creates.
_NULLABLE_IN_TABLE = frozenset({"enforced"})


def _field(column: Column) -> bigquery.SchemaField:
    required = not column.nullable and column.name not in _NULLABLE_IN_TABLE
    if required:
        return bigquery.SchemaField(column.name, _TYPES[column.kind], mode="REQUIRED")
    return bigquery.SchemaField(column.name, _TYPES[column.kind])


SCHEMA: tuple[bigquery.SchemaField, ...] = tuple(_field(c) for c in DECISION_COLUMNS)
CLUSTERING = ["route", "decision"]


class InsertFailed(FilterError):
    """BigQuery answered the insert with per-row errors."""

    def __init__(self, table: str, errors: list[dict[str, Any]]):
        self.errors = errors
        first = errors[0] if errors else {}
        super().__init__(f"{len(errors)} row(s) rejected by {table}; first: {first}")


def make_client(project: str | None, location: str | None = None) -> bigquery.Client:
    """A BigQuery client; anonymous against `$BIGQUERY_EMULATOR_HOST` when that is set."""
    host = os.environ.get(EMULATOR_ENV)
    if host:
        if not host.startswith(("http://", "https://")):
            host = f"http://{host}"
        return bigquery.Client(
            project=project,
            location=location,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options=ClientOptions(api_endpoint=host),
        )
    return bigquery.Client(project=project, location=location)


def _timestamp(seconds: float | None) -> str | None:
    """Epoch seconds → RFC 3339 in UTC (JSON numbers are read as seconds by BigQuery but
    as microseconds by the emulator; a string means the same to both)."""
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_TIMES = tuple(c.name for c in DECISION_COLUMNS if c.kind == "time")


def to_row(rec: DecisionRecord) -> dict[str, Any]:
    """One decision record as a JSON row of the decisions table."""
    row = dict(zip(COLUMN_NAMES, rec.values(), strict=True))
    for name in _TIMES:
        row[name] = _timestamp(row[name])
    row["extra"] = encode_extra(rec.extra) if rec.extra else None
    # text UTF-8 cannot write (a lone surrogate) is sent escaped: the row is never refused for it
    return {k: text(v) if isinstance(v, str) else v for k, v in row.items()}


def insert_id(rec: DecisionRecord) -> str:
    """A stable insertId, so BigQuery's best-effort dedup drops a retried batch's rows."""
    raw = f"{rec.route}\x00{rec.message_id}\x00{rec.decision}\x00{rec.time!r}\x00{rec.key}"
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class BigQuerySink:
    """Writes batches of decision records to one table with `insertAll` (streaming inserts).

    Each `write()` runs in a thread and is bounded by `deadline` seconds in all (the
    client's own retry would otherwise keep retrying a 5xx for ten minutes); it raises on
    any failure, leaving retry-then-drop to `BatchingRecorder`.
    """

    def __init__(
        self,
        client: bigquery.Client,
        table: str,
        *,
        partition_expiration_days: int = 90,
        location: str | None = None,
        deadline: float = 20.0,
        timeout: float = 10.0,
        create_table: bool = True,
    ) -> None:
        if table.count(".") == 1:
            table = f"{client.project}.{table}"
        self.client = client
        self.table = table
        self.name = f"bigquery:{table}"
        self.partition_expiration_days = partition_expiration_days
        self.location = location
        self.timeout = timeout
        self.retry: Retry = DEFAULT_RETRY.with_timeout(deadline)
        self._create_table = create_table
        self._table_ready = not create_table

    def table_definition(self) -> bigquery.Table:
        table = bigquery.Table(self.table, schema=list(SCHEMA))
        table.time_partitioning = bigquery.TimePartitioning(
            type_=bigquery.TimePartitioningType.DAY,
            field="time",
            expiration_ms=self.partition_expiration_days * 86_400_000,
        )
        table.clustering_fields = CLUSTERING
        table.description = "pubsub-filter decisions: one row per message decided"
        return table

    def ensure_table(self) -> bigquery.Table:
        """Return the table, creating the dataset and table first if they are missing (blocking)."""
        try:
            table = self.client.get_table(self.table, retry=self.retry, timeout=self.timeout)
        except NotFound:
            project, dataset_id, _ = self.table.split(".")
            dataset = bigquery.Dataset(f"{project}.{dataset_id}")
            if self.location:
                dataset.location = self.location
            self.client.create_dataset(dataset, exists_ok=True, retry=self.retry, timeout=self.timeout)
            table = self.client.create_table(
                self.table_definition(), exists_ok=True, retry=self.retry, timeout=self.timeout
            )
        self._table_ready = True
        return table

    def _insert(self, rows: list[DecisionRecord]) -> None:
        if not self._table_ready:
            self.ensure_table()
        errors = self.client.insert_rows_json(
            self.table,
            [to_row(r) for r in rows],
            row_ids=[insert_id(r) for r in rows],
            retry=self.retry,
            timeout=self.timeout,
        )
        if errors:
            raise InsertFailed(self.table, list(errors))

    async def write(self, rows: list[DecisionRecord]) -> None:
        if rows:
            await asyncio.to_thread(self._insert, rows)

    async def close(self) -> None:
        await asyncio.to_thread(self.client.close)


def _table_of(client: bigquery.Client, cfg: BigqueryRecordsConfig) -> str:
    return f"{client.project}.{cfg.dataset}.{cfg.table}"


def bigquery_recorder(cfg: BigqueryRecordsConfig, project: str | None) -> BatchingRecorder:
    """The configured decisions table behind a batching recorder (no network I/O here)."""
    client = make_client(cfg.project or project, cfg.location)
    sink = BigQuerySink(
        client,
        _table_of(client, cfg),
        partition_expiration_days=cfg.partition_expiration_days,
        location=cfg.location,
    )
    return BatchingRecorder(
        sink,
        batch_size=cfg.batch_size,
        flush_interval=cfg.flush_interval,
        max_buffer=cfg.max_buffer,
    )


# --- reading it back: skip rate ------------------------------------------------------

_BUCKETS = {
    "route": "CAST(NULL AS TIMESTAMP)",
    "hour": "TIMESTAMP_TRUNC(time, HOUR)",
    "day": "TIMESTAMP_TRUNC(time, DAY)",
}


def _counts_query(table: str, since: float | None, by: str) -> tuple[str, list[Any]]:
    if by not in _BUCKETS:
        raise ValueError(f"by must be one of {sorted(_BUCKETS)}, not {by!r}")
    where = ""
    params: list[Any] = [bigquery.ScalarQueryParameter("within", "STRING", WITHIN)]
    if since is not None:
        where = "WHERE time >= @since"
        params.append(bigquery.ScalarQueryParameter("since", "TIMESTAMP", dt.datetime.fromtimestamp(since, dt.UTC)))
    # a suppression within tolerance is counted under its own name (`skip-rate`)
    label = (
        f"CASE WHEN decision = 'suppressed' AND SUBSTR(reason, 1, {len(WITHIN)}) = @within "
        f"THEN '{WITHIN_TOLERANCE}' "
        "WHEN decision IN ('forwarded', 'suppressed') "
        f"AND SUBSTR(reason, 1, {len(SELECTION_CHANGED)}) = '{SELECTION_CHANGED}' "
        f"THEN CASE decision WHEN 'forwarded' THEN '{FORWARDED_LABEL}' ELSE '{SUPPRESSED_LABEL}' END "
        "ELSE decision END"
    )
    sql = (
        f"SELECT route, {_BUCKETS[by]} AS bucket, {label} AS label, enforced, COUNT(*) AS n\n"
        f"FROM `{table}`\n{where}\n"
        "GROUP BY route, bucket, label, enforced\n"
        "ORDER BY route, bucket, label, enforced"
    )
    return sql, params


#: Bucket labels, the same strings the SQLite records backend returns.
_BUCKET_FORMAT = {"hour": "%Y-%m-%dT%H:00:00Z", "day": "%Y-%m-%d"}


def _bucket(value: Any, by: str) -> str | None:
    if value is None or by not in _BUCKET_FORMAT:
        return None
    if isinstance(value, dt.datetime):
        stamp: dt.datetime = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return stamp.astimezone(dt.UTC).strftime(_BUCKET_FORMAT[by])
    return str(value)


class BigQueryReader:
    """The `RecordsReader` of one decisions table (`project.dataset.table`): one query per read."""

    def __init__(self, client: bigquery.Client, table: str, *, job_timeout: float = 60.0) -> None:
        self.client = client
        self.table = table
        self.job_timeout = job_timeout

    def decision_counts(self, since: float | None, by: Bucket) -> list[DecisionCount]:
        sql, params = _counts_query(self.table, since, by)
        job = self.client.query(sql, job_config=bigquery.QueryJobConfig(query_parameters=params))
        return [
            {
                "route": row["route"],
                "bucket": _bucket(row["bucket"], by),
                "decision": row["label"],
                "enforced": row["enforced"],
                "n": int(row["n"]),
            }
            for row in job.result(timeout=self.job_timeout)
        ]

    def keys_forwarded(self, route: str, since: float | None) -> int:
        """How many keys of `route` were forwarded at or after `since` (`pubsub-filter plan`)."""
        params: list[Any] = [bigquery.ScalarQueryParameter("route", "STRING", route)]
        where = "WHERE route = @route AND decision = 'forwarded'"
        if since is not None:
            where += " AND time >= @since"
            params.append(bigquery.ScalarQueryParameter("since", "TIMESTAMP", dt.datetime.fromtimestamp(since, dt.UTC)))
        sql = f"SELECT COUNT(DISTINCT key) AS n FROM `{self.table}`\n{where}"
        job = self.client.query(sql, job_config=bigquery.QueryJobConfig(query_parameters=params))
        return sum(int(row["n"]) for row in job.result(timeout=self.job_timeout))

    def decision_rows(self, route: str, since: float | None) -> list[DecisionRow]:
        params: list[Any] = [bigquery.ScalarQueryParameter("route", "STRING", route)]
        where = "WHERE route = @route"
        if since is not None:
            where += " AND time >= @since"
            stamp = dt.datetime.fromtimestamp(since, dt.UTC)
            params.append(bigquery.ScalarQueryParameter("since", "TIMESTAMP", stamp))
        sql = (
            "SELECT time, decision, enforced, key, reason, fingerprint, previous_fingerprint, extra\n"
            f"FROM `{self.table}`\n{where}\nORDER BY time"
        )
        job = self.client.query(sql, job_config=bigquery.QueryJobConfig(query_parameters=params))
        return [_decision_row(row) for row in job.result(timeout=self.job_timeout)]

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]


def _decision_row(row: Any) -> DecisionRow:
    stamp = row["time"]
    extra = row["extra"]
    if isinstance(extra, str):
        extra = json.loads(extra) if extra and extra != "null" else {}
        if isinstance(extra, str):  # a JSON column holding the JSON text as a string
            extra = json.loads(extra)
    return {
        "time": stamp.timestamp() if isinstance(stamp, dt.datetime) else float(stamp),
        "decision": row["decision"],
        "enforced": row["enforced"] is not False,
        "key": row["key"],
        "reason": row["reason"],
        "fingerprint": row["fingerprint"],
        "previous_fingerprint": row["previous_fingerprint"],
        "extra": extra if isinstance(extra, dict) else {},
    }


def bigquery_reader(cfg: BigqueryRecordsConfig, project: str | None) -> BigQueryReader:
    """A reader of the configured decisions table (no network I/O here)."""
    client = make_client(cfg.project or project, cfg.location)
    return BigQueryReader(client, _table_of(client, cfg))
