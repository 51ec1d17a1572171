"""The YAML config: routes and backends, validated on load with errors that name file, route and key.

The file stays plain YAML (no tags, anchors optional) because Terraform reads the same
file with `yamldecode` to provision subscriptions and topics.
"""

from __future__ import annotations

import os
import re
from pathlib import Path as FsPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from filter.core import yamlfile
from filter.core.paths import Path, PathError
from filter.core.pubsub_names import Kind, check_name
from filter.core.times import parse_duration

CONFIG_ENV = "PUBSUB_FILTER_CONFIG"
DEFAULT_CONFIG = "filter.yaml"


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _parse_size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = re.match(r"^\s*(\d+)\s*(B|KiB|MiB|KB|MB)?\s*$", str(value), re.ASCII)
    if not m:
        raise ValueError(f"{value!r} is not a size: write e.g. 1048576, 512KiB or 10MiB")
    mult = {"B": 1, None: 1, "KiB": 1024, "KB": 1000, "MiB": 1024**2, "MB": 1000**2}[m.group(2)]
    return int(m.group(1)) * mult


Size = Annotated[int, BeforeValidator(_parse_size)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- backends ---------------------------------------------------------------------


FilePath = Annotated[str, Field(min_length=1)]


class SqliteStore(_Strict):
    backend: Literal["sqlite"] = "sqlite"
    path: FilePath = "filter-state.db"


class FirestoreStore(_Strict):
    backend: Literal["firestore"]
    project: str | None = None
    database: str = "(default)"
    collection: str = "pubsub-filter"


class OutboxPublisher(_Strict):
    backend: Literal["outbox"] = "outbox"
    path: FilePath = "outbox.jsonl"
    fsync: bool = False  # survive a machine crash too, at ~0.7 ms a publish (a process crash never loses a line)


class PubsubPublisher(_Strict):
    backend: Literal["pubsub"]
    project: str | None = None
    timeout: Duration = 30.0


class SqliteRecords(_Strict):
    backend: Literal["sqlite"] = "sqlite"
    path: FilePath = "filter-decisions.db"


class BigqueryRecords(_Strict):
    backend: Literal["bigquery"]
    project: str | None = None
    dataset: str = "pubsub_filter"
    table: str = "decisions"
    location: str | None = None
    partition_expiration_days: int = Field(default=90, ge=1)
    batch_size: int = Field(default=500, ge=1)
    flush_interval: Duration = 5.0
    max_buffer: int = Field(default=50_000, ge=1)


class LeaseConfig(_Strict):
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
        if not self.duration > self.ack_deadline > self.heartbeat:
            raise ValueError(
                f"need duration > ack_deadline > heartbeat, got duration={self.duration:g}s, "
                f"ack_deadline={self.ack_deadline:g}s, heartbeat={self.heartbeat:g}s"
            )
        return self


class StoreErrors(_Strict):
    """How long the store may take before the route's `on_store_error` applies."""

    timeout: Duration = 2.0  # per attempt
    budget: Duration = 5.0  # all attempts together, well under the ack deadline


class ServerConfig(_Strict):
    max_body: Annotated[Size, Field(ge=1024)] = 10 * 1024 * 1024
    shutdown_grace: Duration = 10.0
    body_timeout: Duration = 10.0  # a push body not received in full by then is answered 408


class PullConfig(_Strict):
    """Flow control for `pubsub-filter pull` (per subscription)."""

    max_messages: int = Field(default=100, ge=1)
    max_bytes: Size = 50 * 1024 * 1024
    max_lease_duration: Duration | None = None  # default: lease.duration
    # `/healthz`, `/readyz` and `/metrics` for probes and scrapes; off unless set (or --health-port)
    health_port: int | None = Field(default=None, ge=1, le=65535)
    health_host: str = "0.0.0.0"


class TelemetryConfig(_Strict):
    """OpenTelemetry: metrics on `GET /metrics` (and over OTLP when `OTEL_EXPORTER_OTLP_*` names an
    endpoint), spans when an OTLP endpoint is set. `OTEL_SDK_DISABLED=true` turns both off too."""

    metrics: bool = True
    traces: bool = True


class AuthConfig(_Strict):
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


# --- routes -----------------------------------------------------------------------


def _pubsub_name(kind: Kind) -> Any:
    def check(value: Any) -> Any:
        return check_name(value, kind) if isinstance(value, str) else value

    return BeforeValidator(check)


def _path(value: Any) -> Path:
    if isinstance(value, Path):
        return value
    try:
        return Path.parse(value)
    except PathError as exc:
        raise ValueError(str(exc)) from None


FieldPath = Annotated[Path, BeforeValidator(_path)]


class Condition(_Strict):
    """A condition on one field: equals a value (or not), is one of several, or is present.

    What each test means, on a route's `bypass` and on `replay --where`: `filter.core.conditions`.
    """

    field: FieldPath
    equals: Any = None  # `equals: null` is a test too: which tests were written is `model_fields_set`
    not_equals: Any = None
    one_of: list[Any] | None = Field(default=None, alias="in")
    exists: bool | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, arbitrary_types_allowed=True)

    @model_validator(mode="after")
    def _one_test(self) -> Condition:
        written = self.model_fields_set
        tests = ["equals" in written, "not_equals" in written, self.one_of is not None, self.exists is not None]
        if sum(tests) != 1:
            raise ValueError("a condition needs exactly one of equals, in, exists, not_equals")
        return self


class Route(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    subscription: Annotated[str | None, _pubsub_name("subscription")] = None
    destination: Annotated[str, _pubsub_name("topic")]
    key: list[FieldPath] = Field(min_length=1)
    rows: FieldPath | None = None
    row_key: list[str] = []
    include: list[str] = []
    exclude: list[str] = []
    window: Duration | None = None
    mode: Literal["enforce", "shadow"] = "enforce"
    scheme: Literal["canonical", "data_hash", "event"] = "canonical"
    on_store_error: Literal["forward", "retry"] = "forward"
    stale: Literal["suppress", "forward"] = "suppress"
    bypass: list[Condition] = []
    rows_mode: Literal["whole", "changed"] = "whole"
    removed_rows: Literal["attribute", "tombstone", "ignore"] = "attribute"
    audit_sample: float = Field(default=0.0, ge=0.0, le=1.0)

    @field_validator("bypass", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("rows")
    @classmethod
    def _rows_in_payload(cls, value: Path | None) -> Path | None:
        if value is not None and value.root != "payload":
            raise ValueError("rows must be a payload path such as payload.players (or just payload)")
        return value

    @property
    def enforced(self) -> bool:
        return self.mode == "enforce"


_DEFAULT_BACKENDS = {"store": "sqlite", "publisher": "outbox", "records": "sqlite"}
_SECTIONS = (*_DEFAULT_BACKENDS, "lease", "store_errors", "server", "auth", "pull", "telemetry")


class Config(_Strict):
    store: SqliteStore | FirestoreStore = Field(default_factory=SqliteStore, discriminator="backend")
    publisher: OutboxPublisher | PubsubPublisher = Field(default_factory=OutboxPublisher, discriminator="backend")
    records: SqliteRecords | BigqueryRecords = Field(default_factory=SqliteRecords, discriminator="backend")
    lease: LeaseConfig = Field(default_factory=LeaseConfig)
    store_errors: StoreErrors = Field(default_factory=StoreErrors)
    server: ServerConfig = Field(default_factory=ServerConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    pull: PullConfig = Field(default_factory=PullConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    project: str | None = None
    state_ttl: Duration = 30 * 86400.0  # how long a key's state lives after its last forward
    routes: list[Route] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _section_defaults(cls, raw: Any) -> Any:
        """An empty section is its defaults; a backend section without `backend` is the embedded one."""
        if not isinstance(raw, dict):
            return raw
        raw = {k: v for k, v in raw.items() if not (k in _SECTIONS and v is None)}
        for section, backend in _DEFAULT_BACKENDS.items():
            if isinstance(raw.get(section), dict) and "backend" not in raw[section]:
                raw[section] = {"backend": backend, **raw[section]}
        return raw

    def route(self, name: str) -> Route | None:
        for r in self.routes:
            if r.name == name:
                return r
        return None


# --- loading ----------------------------------------------------------------------


class ConfigError(Exception):
    """Every problem found in one config file, each naming the file, route and key."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


def _where(loc: tuple[Any, ...], raw: Any) -> str:
    """Turn pydantic's location into `route 'injury-report': key[1]`."""
    parts = [p for p in loc if not (isinstance(p, str) and p in ("function-after", "function-before"))]
    # drop the union-member tags pydantic inserts (e.g. 'sqlite', 'firestore')
    backends = ("sqlite", "firestore", "outbox", "pubsub", "bigquery")
    if len(parts) >= 2 and parts[0] in ("store", "publisher", "records") and parts[1] in backends:
        parts = [parts[0], *parts[2:]]
    if len(parts) >= 2 and parts[0] == "routes" and isinstance(parts[1], int):
        idx = parts[1]
        name = None
        if isinstance(raw, dict) and isinstance(raw.get("routes"), list) and idx < len(raw["routes"]):
            entry = raw["routes"][idx]
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                name = entry["name"]  # `route 5` would read as a position
        head = f"route {name!r}" if name else f"routes[{idx}]"
        rest = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts[2:]).lstrip(".")
        return f"{head}: {rest}" if rest else head
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")
    return text or "(top level)"


def parse(raw: Any, source: str = "<config>") -> Config:
    """Validate a decoded config: every problem at once, field errors and rules across keys alike."""
    if raw is None:
        raise ConfigError(source, ["the file is empty: it needs at least a routes list"])
    if not isinstance(raw, dict):
        raise ConfigError(source, ["the top level must be a mapping with a routes list"])
    problems = []
    config = None
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key (check the spelling against the config reference)" + _defaulted(raw, err["loc"])
            problems.append(f"{_where(tuple(err['loc']), raw)}: {msg}")
    # Rules across keys run on whatever is readable, so they show up together with the field errors.
    problems += [f"{_where(loc, raw)}: {msg}" for loc, msg in _rules(raw)]
    if problems or config is None:
        raise ConfigError(source, problems)
    return config


def _defaulted(raw: dict[str, Any], loc: tuple[Any, ...]) -> str:
    """A hint when an unknown key belongs to the backend that `backend:` was left out for."""
    section = raw.get(loc[0]) if loc else None
    if loc and loc[0] in _DEFAULT_BACKENDS and isinstance(section, dict) and "backend" not in section:
        return f" for backend {_DEFAULT_BACKENDS[loc[0]]}, the default when backend is not set"
    return ""


# --- rules across keys ------------------------------------------------------------
# Each reads the raw mapping leniently: a value of the wrong type is skipped here (its
# field error is reported by the model), so one broken key hides no other problem.

Problem = tuple[tuple[Any, ...], str]


def _section(raw: dict[str, Any], name: str) -> dict[str, Any]:
    value = raw.get(name)
    return value if isinstance(value, dict) else {}


def _seconds(mapping: dict[str, Any], key: str, default: float | None) -> float | None:
    if key not in mapping or mapping[key] is None:
        return default
    try:
        return parse_duration(mapping[key])
    except ValueError:
        return None


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _rules(raw: dict[str, Any]) -> list[Problem]:
    return [*_route_rules(raw), *_timing_rules(raw), *_auth_rules(raw), *_file_rules(raw)]


def _route_rules(raw: dict[str, Any]) -> list[Problem]:
    routes = raw.get("routes")
    if not isinstance(routes, list):
        return []
    found: list[Problem] = []
    first: dict[str, int] = {}
    for i, route in enumerate(routes):
        if not isinstance(route, dict):
            continue
        name = route.get("name")
        if isinstance(name, str):
            if name in first:
                found.append((("routes", i, "name"), f"route name {name!r} is used twice (routes[{first[name]}])"))
            first.setdefault(name, i)
        has_rows = route.get("rows") is not None
        row_key = route.get("row_key")
        scheme = route.get("scheme", "canonical")
        if scheme == "event" and not has_rows:
            found.append((("routes", i, "rows"), "scheme 'event' needs rows: the path to the list of events"))
        overlap = set(_strings(route.get("include"))) & set(_strings(route.get("exclude")))
        if overlap:
            found.append((("routes", i, "exclude"), f"fields both included and excluded: {sorted(overlap)}"))
        if row_key and not has_rows:
            found.append((("routes", i, "row_key"), "row_key is set but rows is not: row_key only orders rows"))
        if route.get("rows_mode") == "changed":
            if not (has_rows and row_key):
                found.append(
                    (("routes", i, "rows_mode"), "rows_mode 'changed' needs rows and row_key: rows are matched by key")
                )
            if scheme != "canonical":
                found.append((("routes", i, "rows_mode"), "rows_mode 'changed' works with scheme 'canonical' only"))
    return found


def _timing_rules(raw: dict[str, Any]) -> list[Problem]:
    """Budgets that must nest: a store call inside the store budget inside the ack deadline;
    state kept at least as long as a lease and as every route's window."""
    lease, errors = _section(raw, "lease"), _section(raw, "store_errors")
    defaults_lease, defaults_errors = LeaseConfig(), StoreErrors()
    ack = _seconds(lease, "ack_deadline", defaults_lease.ack_deadline)
    duration = _seconds(lease, "duration", defaults_lease.duration)
    budget = _seconds(errors, "budget", defaults_errors.budget)
    timeout = _seconds(errors, "timeout", defaults_errors.timeout)
    ttl = _seconds(raw, "state_ttl", Config.model_fields["state_ttl"].default)
    found: list[Problem] = []
    if budget is not None and ack is not None and budget >= ack:
        found.append(
            (
                ("store_errors", "budget"),
                f"{budget:g}s must be shorter than lease.ack_deadline ({ack:g}s): after the budget the route's "
                "on_store_error still has to publish and answer before Pub/Sub redelivers",
            )
        )
    if timeout is not None and budget is not None and timeout > budget:
        found.append(
            (
                ("store_errors", "timeout"),
                f"{timeout:g}s is longer than store_errors.budget ({budget:g}s), which bounds every attempt together",
            )
        )
    if ttl is not None and duration is not None and ttl < duration:
        found.append(
            (
                ("state_ttl",),
                f"{ttl:g}s is shorter than lease.duration ({duration:g}s): a key's state, lease "
                "included, could expire while a publish holds it",
            )
        )
    routes = raw.get("routes")
    for i, route in enumerate(routes if isinstance(routes, list) else []):
        window = _seconds(route, "window", None) if isinstance(route, dict) else None
        if ttl is not None and window is not None and window > ttl:
            found.append(
                (
                    ("routes", i, "window"),
                    f"{window:g}s is longer than state_ttl ({ttl:g}s): the state the window "
                    "compares with would expire first; raise state_ttl",
                )
            )
    return found


def _auth_rules(raw: dict[str, Any]) -> list[Problem]:
    """Auth that reads as on is on, and checks what it seems to: no half-configured section."""
    if "auth" not in raw:
        return []
    auth = _section(raw, "auth")
    audience, account, anyone = auth.get("audience"), auth.get("service_account"), auth.get("any_service_account")
    found: list[Problem] = []
    if not audience and (account or anyone is True):
        found.append(
            (
                ("auth", "audience"),
                "is not set, so no token would be verified: set the audience the push "
                "subscriptions put in their tokens (or remove the auth section to turn verification off)",
            )
        )
    if audience and not account and anyone is not True:
        found.append(
            (
                ("auth", "service_account"),
                "is not set, so a token of any service account in any project would be "
                "accepted: name the push service account, or write any_service_account: true if that is what you want",
            )
        )
    if account and anyone is True:
        found.append((("auth", "any_service_account"), "contradicts service_account: keep one of them"))
    return found


def _file_rules(raw: dict[str, Any]) -> list[Problem]:
    """The outbox appends JSON lines: on a SQLite file it would corrupt the database."""
    outbox = _section(raw, "publisher")
    if outbox.get("backend", "outbox") != "outbox":
        return []
    path = outbox.get("path", OutboxPublisher().path)
    found: list[Problem] = []
    for section in ("store", "records"):
        other = _section(raw, section)
        if other.get("backend", "sqlite") == "sqlite" and isinstance(path, str) and path:
            other_path = other.get("path", _DEFAULT_SQLITE[section])
            if isinstance(other_path, str) and os.path.normpath(other_path) == os.path.normpath(path):
                found.append((("publisher", "path"), f"{path!r} is also {section}.path: give the outbox its own file"))
    return found


_DEFAULT_SQLITE = {"store": SqliteStore().path, "records": SqliteRecords().path}


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """Load and validate a config file (default: $PUBSUB_FILTER_CONFIG, then ./filter.yaml)."""
    src = str(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    try:
        text = FsPath(src).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(src, [f"no such file (set --config or ${CONFIG_ENV})"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(src, [f"cannot read it: {exc}"]) from None
    try:
        raw = yamlfile.load(text)
    except yamlfile.DuplicateKeys as exc:
        raise ConfigError(src, [f"{p} (YAML keeps only the last one)" for p in exc.problems]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(src, [f"{where}not valid YAML: {getattr(exc, 'problem', exc)}"]) from None
    return parse(raw, src)
