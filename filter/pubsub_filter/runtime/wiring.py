"""Config → engine: pick each backend named in the YAML. Google backends import lazily,
so the embedded default starts without loading their client libraries, and without the
Firestore and BigQuery clients installed at all (their extras: `backends.extras`)."""

from __future__ import annotations

import os
import sqlite3

from pubsub_filter.backends import extras
from pubsub_filter.backends.records.batch import BatchingRecorder
from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.core.config.schema import Config
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.offload import Lane
from pubsub_filter.core.ports import DecisionRecorder, Failure, Publisher, RecordsReader, StateStore, StoreUnavailable
from pubsub_filter.observability.telemetry import Telemetry


def project_of(cfg: Config, specific: str | None = None) -> str | None:
    return specific or cfg.project or os.environ.get("GOOGLE_CLOUD_PROJECT")


def make_store(cfg: Config) -> StateStore:
    s = cfg.store
    store: StateStore
    if s.backend == "sqlite":
        from pubsub_filter.backends.stores.sqlite import PURGE_EVERY, SqliteStore

        try:
            store = SqliteStore(s.path, purge_every=PURGE_EVERY)  # never suspends: the guard sets no timeout
        except StoreUnavailable as exc:  # at start this is the file, not an outage to ride out
            raise Failure(f"cannot open state file {s.path}: {exc.__cause__ or exc}") from exc
    else:
        extras.require(extras.FIRESTORE_STORE)
        from pubsub_filter.backends.stores.firestore import FirestoreStore

        store = FirestoreStore(project=project_of(cfg, s.project), database=s.database, collection=s.collection)
    return GuardedStore(store, cfg.store_errors)


def make_publisher(cfg: Config) -> Publisher:
    p = cfg.publisher
    if p.backend == "outbox":
        from pubsub_filter.backends.publishers.outbox import OutboxPublisher

        return OutboxPublisher(p.path, fsync=p.fsync)
    from pubsub_filter.backends.publishers.pubsub import PubsubPublisher

    return PubsubPublisher(project=project_of(cfg, p.project), timeout=p.timeout)


def make_recorder(cfg: Config) -> DecisionRecorder:
    r = cfg.records
    if r.backend == "sqlite":
        from pubsub_filter.backends.records.inline import InlineSqliteRecorder
        from pubsub_filter.backends.records.sqlite import SqliteSink

        # Written before the push answers, so `skip-rate` run right after a curl sees it.
        try:
            return InlineSqliteRecorder(SqliteSink(r.path), BatchingRecorder(SqliteSink(r.path), flush_interval=0.5))
        except sqlite3.Error as exc:
            raise Failure(f"cannot open records file {r.path}: {exc}") from exc
    extras.require(extras.BIGQUERY_RECORDS)
    from pubsub_filter.backends.records.bigquery import bigquery_recorder

    return bigquery_recorder(r, project_of(cfg, r.project))


def make_reader(cfg: Config | None, log: str | None = None) -> RecordsReader:
    """What skip-rate reads: the decision log lines at `log` (a file, or - for stdin) when
    given, else the config's records backend."""
    if log is not None:
        from pubsub_filter.backends.records.log_lines import LogLinesReader

        return LogLinesReader(log)
    if cfg is None:
        raise ValueError("a records reader needs a config or a log to read")
    r = cfg.records
    if r.backend == "sqlite":
        from pubsub_filter.backends.records.sqlite import SqliteReader

        return SqliteReader(r.path)
    extras.require(extras.BIGQUERY_RECORDS)
    from pubsub_filter.backends.records.bigquery import bigquery_reader
    from pubsub_filter.runtime.operational import BIGQUERY, require

    require(BIGQUERY)  # the client would retry an unreachable endpoint for minutes
    return bigquery_reader(r, project_of(cfg, r.project))


def make_engine(cfg: Config, telemetry: Telemetry | None = None, lane: Lane | None = None) -> Engine:
    """With `telemetry`, the store and publisher are measured and traced and the engine reports to
    it. `lane`: where large messages are decided (by default a thread: `core.engine.offload`)."""
    store, publisher = make_store(cfg), make_publisher(cfg)
    if telemetry is None:
        return Engine(cfg, store, publisher, make_recorder(cfg), lane=lane)
    from pubsub_filter.observability.instrumented import InstrumentedPublisher, InstrumentedStore

    recorder = make_recorder(cfg)
    engine = Engine(
        cfg,
        InstrumentedStore(store, telemetry),
        InstrumentedPublisher(publisher, telemetry),
        recorder,
        telemetry=telemetry,
        lane=lane,
    )
    # what the metrics observe, handed over: the route names, the decisions under way, the records' outcomes
    telemetry.watch(engine.facts.routes, lambda: engine.in_flight, recorder.outcomes)
    return engine


def make_telemetry(cfg: Config) -> Telemetry:
    from pubsub_filter.runtime.otel import from_config

    return from_config(cfg.telemetry.metrics, cfg.telemetry.traces)
