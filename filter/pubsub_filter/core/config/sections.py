"""The config's sections other than routes: the backends, lease timing, store error budget,
server, pull, telemetry, auth and decision lines, each a strict pydantic model with its
defaults, and the value types they share (durations, sizes)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from pubsub_filter.core.pubsub_limits import DEFAULT_MAX_BODY
from pubsub_filter.core.times import parse_duration, parse_wait

Duration = Annotated[float, BeforeValidator(parse_duration)]


#: A duration that may also be 0 (none).
Wait = Annotated[float, BeforeValidator(parse_wait)]


class Quieting(NamedTuple):
    """How one decision's lines are logged: at `level` (None: the decision's own level) for the
    share `sample` of its messages (by message id), at debug for the others."""

    level: str | None = None
    sample: float = 1.0


def _parse_size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = re.match(r"^\s*(\d+)\s*(B|KiB|MiB|KB|MB)?\s*$", str(value), re.ASCII)
    if not m:
        raise ValueError(f"{value!r} is not a size: write e.g. 1048576, 512KiB or 10MiB")
    mult = {"B": 1, None: 1, "KiB": 1024, "KB": 1000, "MiB": 1024**2, "MB": 1000**2}[m.group(2)]
    return int(m.group(1)) * mult


Size = Annotated[int, BeforeValidator(_parse_size)]


class Strict(BaseModel):
    """A section whose unknown keys are errors (a typo must not fall back to a default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- the embedded backends: the defaults, files on one machine --------------------


FilePath = Annotated[str, Field(min_length=1)]


class SqliteStoreConfig(Strict):
    """The embedded state store: one SQLite file, shared by the processes on one machine."""

    backend: Literal["sqlite"] = "sqlite"
    path: FilePath = "filter-state.db"


class OutboxConfig(Strict):
    """The embedded publisher: each forwarded message appended to a JSON-lines file."""

    backend: Literal["outbox"] = "outbox"
    path: FilePath = "outbox.jsonl"
    fsync: bool = False  # survive a machine crash too, at ~0.7 ms a publish (a process crash never loses a line)


class SqliteRecordsConfig(Strict):
    """The embedded decision records: a SQLite table, written as each decision is made."""

    backend: Literal["sqlite"] = "sqlite"
    path: FilePath = "filter-decisions.db"


# --- the Google Cloud backends ---------------------------------------------------


class FirestoreStoreConfig(Strict):
    """Key state in Firestore, shared by every instance (the project defaults to the config's)."""

    backend: Literal["firestore"]
    project: str | None = None
    database: str = "(default)"
    collection: str = "pubsub-filter"


class PubsubPublisherConfig(Strict):
    """Forwards to Pub/Sub topics; `timeout` is the time budget of one publish, retries included."""

    backend: Literal["pubsub"]
    project: str | None = None
    timeout: Duration = 30.0


class BigqueryRecordsConfig(Strict):
    """Decision records streamed to a BigQuery table in batches, off the request path."""

    backend: Literal["bigquery"]
    project: str | None = None
    dataset: str = "pubsub_filter"
    table: str = "decisions"
    location: str | None = None
    partition_expiration_days: int = Field(default=90, ge=1)
    batch_size: int = Field(default=500, ge=1)
    flush_interval: Duration = 5.0
    max_buffer: int = Field(default=50_000, ge=1)


# --- the other sections -----------------------------------------------------------


class LeaseConfig(Strict):
    """How long a claim on a key lasts and how often it is renewed while a publish runs.

    Must satisfy duration > ack_deadline > heartbeat: a lease that outlives the
    subscription's ack deadline means a redelivery of an in-flight message finds the
    lease still held (and is answered `duplicate`) instead of taking it over.
    """

    duration: Duration = 120.0
    heartbeat: Duration = 20.0
    ack_deadline: Duration = 60.0

    @model_validator(mode="after")
    def _ordered(self) -> LeaseConfig:
        problem = lease_out_of_order(self.duration, self.ack_deadline, self.heartbeat)
        if problem:
            raise ValueError(problem)
        return self


def lease_out_of_order(duration: float, ack_deadline: float, heartbeat: float) -> str | None:
    """Why a lease's timings do not nest; None when they do. The model checks it, and so does a
    rule across keys (`rules`) with the same words, so that a broken lease key beside them hides
    it not (`schema.parse` says it once)."""
    if duration > ack_deadline > heartbeat:
        return None
    return (
        f"need duration > ack_deadline > heartbeat, got duration={duration:g}s, "
        f"ack_deadline={ack_deadline:g}s, heartbeat={heartbeat:g}s"
    )


class StoreErrors(Strict):
    """How long the store may take before the route's `on_store_error` applies."""

    timeout: Duration = 2.0  # per attempt
    budget: Duration = 5.0  # all attempts together, well under the ack deadline


#: The whole stop's default budget: inside Cloud Run's 10 s between SIGTERM and SIGKILL, with room
#: for the runtime's own exit.
SHUTDOWN_BUDGET = 8.0


#: `server.max_bytes_in_flight`'s default: what fits the Terraform module's default 512 MiB with
#: the largest messages (docs/deploying.md, "Large messages: memory and concurrency").
DEFAULT_MAX_BYTES_IN_FLIGHT = 64 * 1024 * 1024


#: `server.admission_wait`'s default: a large push's decision takes about a second, so a burst's
#: pushes find room in turn, well inside Pub/Sub's push deadline (the ack deadline, 10 s by default).
ADMISSION_WAIT = 2.0


class ServerConfig(Strict):
    # The default takes the largest push a valid message makes (10 MB of data, base64 with every
    # `/` escaped, 100 attributes of the longest names and values, every byte escaped, the fields
    # in both spellings: `pubsub_limits.LARGEST_PUSH`, 26.2 MiB) and stays inside Cloud Run's
    # 32 MiB HTTP/1 request: 27 MiB. Anything less refuses some valid message on every delivery.
    max_body: Annotated[Size, Field(ge=1024)] = DEFAULT_MAX_BODY
    # SIGTERM to exit, every step of the stop included (pubsub_filter.core.engine.stopping)
    shutdown_budget: Annotated[Duration, Field(gt=0)] = SHUTDOWN_BUDGET
    # of the sender's own time (the server's delays are not counted): past it a body is answered 408
    body_timeout: Duration = 10.0
    # Push bodies taken in at once, in bytes: past it a push waits for room (`admission_wait`),
    # unread, then is answered 429 and Pub/Sub sends it again (one is always taken in, whatever its
    # size). docs/deploying.md sizes memory from it: a large message waits as its body and data,
    # and is decided one at a time.
    max_bytes_in_flight: Annotated[Size, Field(ge=1)] = DEFAULT_MAX_BYTES_IN_FLIGHT
    # How long a push past `max_bytes_in_flight` waits for room before its 429; 0 answers at once.
    # Its body waits in its connection meanwhile: a 429 at once had each large push of a burst sent
    # again as soon as any was answered, 7 GB read and dropped in 8 s for 40 pushes of 11 MB.
    admission_wait: Annotated[Wait, Field(le=60)] = ADMISSION_WAIT

    @model_validator(mode="before")
    @classmethod
    def _no_grace(cls, data: Any) -> Any:
        # It bounded only the wait for requests, and the close waited as long again after it: a
        # value kept under the new meaning would be a different promise, so it is refused.
        if isinstance(data, dict) and "shutdown_grace" in data:
            raise ValueError(
                "shutdown_grace is gone: the whole stop now has one budget, server.shutdown_budget "
                f"(SIGTERM to exit, default {SHUTDOWN_BUDGET:g}s, inside Cloud Run's 10 s); "
                "write shutdown_budget instead"
            )
        return data


#: The largest flow-control limit: the client sends it to Pub/Sub as a signed 64-bit integer.
_FLOW_MAX = 2**63 - 1


def _flow_limit(value: int) -> int:
    # The client divides by both limits (0: its consumer thread dies and nothing is pulled) and
    # sends them in the stream's first request (past 64 bits: the same).
    if not 1 <= value <= _FLOW_MAX:
        raise ValueError(f"{value} cannot be run by the Pub/Sub client: it must be from 1 to {_FLOW_MAX}")
    return value


FlowLimit = Annotated[int, AfterValidator(_flow_limit)]


class PullConfig(Strict):
    """Flow control for `pubsub-filter pull` (per subscription)."""

    max_messages: FlowLimit = 100
    max_bytes: Annotated[Size, AfterValidator(_flow_limit)] = 50 * 1024 * 1024
    max_lease_duration: Duration | None = None  # default: lease.duration
    # `/healthz`, `/readyz` and `/metrics` for probes and scrapes; off unless set (or --health-port)
    health_port: int | None = Field(default=None, ge=1, le=65535)
    health_host: str = "0.0.0.0"


class TelemetryConfig(Strict):
    """OpenTelemetry: metrics on `GET /metrics` (and over OTLP when `OTEL_EXPORTER_OTLP_*` names an
    endpoint), spans when an OTLP endpoint is set. `OTEL_SDK_DISABLED=true` turns both off too."""

    metrics: bool = True
    traces: bool = True


class AuthConfig(Strict):
    """OIDC verification of Pub/Sub push requests: on when `audience` is set.

    Which tokens pass must be said in full: `service_account` names the one push account,
    or `any_service_account: true` says that any Google-signed token for the audience will
    do (see `_auth_rules`).
    """

    audience: str | None = Field(default=None, min_length=1)
    service_account: str | None = Field(default=None, pattern=r"^[^@\s]+@[^@\s]+$")
    any_service_account: bool = False
    issuers: tuple[str, ...] = ("https://accounts.google.com", "accounts.google.com")
    certs_url: str = "https://www.googleapis.com/oauth2/v1/certs"


#: How long a key's state lives after its last forward, unless `state_ttl` says otherwise.
STATE_TTL = 30 * 86400.0


# --- decision lines -----------------------------------------------------------------

LineLevel = Literal["debug", "info", "warning", "error"]

#: Decisions whose lines the alerts and runbooks follow: their lines are never quieted.
LOUD_DECISIONS = ("contended", "fail_open", "rejected", "failed")


class DecisionLog(Strict):
    """How one decision's lines are logged: at `level` (default: the decision's own), for the
    share `sample` of its messages, chosen by message id; the others at debug."""

    level: LineLevel | None = None
    sample: float = Field(default=1.0, ge=0.0, le=1.0)


def loud_decisions_quieted(raw: Any) -> str | None:
    """Why a `decision_logs` section may not stand: it quiets a decision the alerts and runbooks
    follow (`LOUD_DECISIONS`); None when it quiets none of them."""
    loud = [name for name in LOUD_DECISIONS if name in raw] if isinstance(raw, dict) else []
    if not loud:
        return None
    return (
        f"the lines of {', '.join(loud)} cannot be quieted: alerts and runbooks follow them "
        f"(quiet any of {', '.join(DecisionLogs.model_fields)})"
    )


class DecisionLogs(Strict):
    """Per decision, how its log line is written (`pubsub_filter.core.engine.decision_line`). Every decision is
    still recorded and counted in the metrics; only the line is quieted. At the default
    LOG_LEVEL (info), a line at debug is not written at all."""

    forwarded: DecisionLog | None = None
    suppressed: DecisionLog | None = None
    duplicate: DecisionLog | None = None
    stale: DecisionLog | None = None
    noise_only: DecisionLog | None = None
    superseded: DecisionLog | None = None  # a burst's older messages (`coalesce`): many lines per forward

    @model_validator(mode="before")
    @classmethod
    def _loud_ones_stay(cls, raw: Any) -> Any:
        # The decisions that may not be quieted are refused by a rule across keys
        # (`config_rules`, `loud_decisions_quieted`), not here: left out of what is validated,
        # they do not hide a misspelt decision beside them.
        if isinstance(raw, dict):
            return {name: value for name, value in raw.items() if name not in LOUD_DECISIONS}
        return raw

    def quieting(self) -> dict[str, Quieting]:
        """The decisions quieted, by name (what `decision_line.line_level` takes)."""
        return {
            name: Quieting(log.level, log.sample)
            for name in type(self).model_fields
            if (log := getattr(self, name)) is not None
        }
