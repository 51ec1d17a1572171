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

from . import yamlfile
from .paths import Path, PathError

CONFIG_ENV = "PUBSUB_FILTER_CONFIG"
DEFAULT_CONFIG = "filter.yaml"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """`90`, `90s`, `15m`, `24h`, `7d`, `500ms` → seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like 90s, 15m, 24h, 7d")
    try:
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            m = _DURATION.match(str(value))
            if not m:
                raise ValueError(f"{value!r} is not a duration: write e.g. 90s, 15m, 24h or 7d")
            seconds = float(m.group(1)) * _UNITS[m.group(2)]
    except OverflowError:
        raise ValueError("that duration is too large") from None
    if not 0 < seconds < 10 * 365 * 86400:  # also rejects nan and inf
        raise ValueError("a duration must be positive and under ten years")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _parse_size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = re.match(r"^\s*(\d+)\s*(B|KiB|MiB|KB|MB)?\s*$", str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size: write e.g. 1048576, 512KiB or 10MiB")
    mult = {"B": 1, None: 1, "KiB": 1024, "KB": 1000, "MiB": 1024**2, "MB": 1000**2}[m.group(2)]
    return int(m.group(1)) * mult


Size = Annotated[int, BeforeValidator(_parse_size)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- backends ---------------------------------------------------------------------


class SqliteStore(_Strict):
    backend: Literal["sqlite"] = "sqlite"
    path: str = "filter-state.db"


class FirestoreStore(_Strict):
    backend: Literal["firestore"]
    project: str | None = None
    database: str = "(default)"
    collection: str = "pubsub-filter"


class OutboxPublisher(_Strict):
    backend: Literal["outbox"] = "outbox"
    path: str = "outbox.jsonl"


class PubsubPublisher(_Strict):
    backend: Literal["pubsub"]
    project: str | None = None
    timeout: Duration = 30.0


class SqliteRecords(_Strict):
    backend: Literal["sqlite"] = "sqlite"
    path: str = "filter-decisions.db"


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


class PullConfig(_Strict):
    """Flow control for `pubsub-filter pull` (per subscription)."""

    max_messages: int = Field(default=100, ge=1)
    max_bytes: Size = 50 * 1024 * 1024
    max_lease_duration: Duration | None = None  # default: lease.duration


class AuthConfig(_Strict):
    """OIDC verification of Pub/Sub push requests (off when `audience` is unset)."""

    audience: str | None = None
    service_account: str | None = None
    issuers: tuple[str, ...] = ("https://accounts.google.com", "accounts.google.com")
    certs_url: str = "https://www.googleapis.com/oauth2/v1/certs"


# --- routes -----------------------------------------------------------------------


def _path(value: Any) -> Path:
    if isinstance(value, Path):
        return value
    try:
        return Path.parse(value)
    except PathError as exc:
        raise ValueError(str(exc)) from None


FieldPath = Annotated[Path, BeforeValidator(_path)]


class Condition(_Strict):
    """A bypass condition on one field: equals a value, is one of several, or is present."""

    field: FieldPath
    equals: Any = None
    one_of: list[Any] | None = Field(default=None, alias="in")
    exists: bool | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, arbitrary_types_allowed=True)

    @model_validator(mode="after")
    def _one_test(self) -> Condition:
        tests = [self.equals is not None, self.one_of is not None, self.exists is not None]
        if sum(tests) != 1:
            raise ValueError("a condition needs exactly one of equals, in, exists")
        return self


class Route(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    subscription: str | None = None
    destination: str
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

    @model_validator(mode="after")
    def _scheme_needs(self) -> Route:
        if self.scheme == "event" and self.rows is None:
            raise ValueError("scheme 'event' needs rows: the path to the list of events")
        overlap = set(self.include) & set(self.exclude)
        if overlap:
            raise ValueError(f"fields both included and excluded: {sorted(overlap)}")
        if self.row_key and self.rows is None:
            raise ValueError("row_key is set but rows is not: row_key only orders rows")
        if self.rows_mode == "changed" and not (self.rows is not None and self.row_key):
            raise ValueError("rows_mode 'changed' needs rows and row_key: rows are matched by their key")
        if self.rows_mode == "changed" and self.scheme != "canonical":
            raise ValueError("rows_mode 'changed' works with scheme 'canonical' only")
        return self

    @property
    def enforced(self) -> bool:
        return self.mode == "enforce"


class Config(_Strict):
    store: SqliteStore | FirestoreStore = Field(default_factory=SqliteStore, discriminator="backend")
    publisher: OutboxPublisher | PubsubPublisher = Field(default_factory=OutboxPublisher, discriminator="backend")
    records: SqliteRecords | BigqueryRecords = Field(default_factory=SqliteRecords, discriminator="backend")
    lease: LeaseConfig = Field(default_factory=LeaseConfig)
    store_errors: StoreErrors = Field(default_factory=StoreErrors)
    server: ServerConfig = Field(default_factory=ServerConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    pull: PullConfig = Field(default_factory=PullConfig)
    project: str | None = None
    state_ttl: Duration = 30 * 86400.0  # how long a key's state lives after its last forward
    routes: list[Route] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_routes(self) -> Config:
        seen: set[str] = set()
        for r in self.routes:
            if r.name in seen:
                raise ValueError(f"route name {r.name!r} is used twice")
            seen.add(r.name)
        return self

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
            if isinstance(entry, dict):
                name = entry.get("name")
        head = f"route {name!r}" if name else f"routes[{idx}]"
        rest = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts[2:]).lstrip(".")
        return f"{head}: {rest}" if rest else head
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")
    return text or "(top level)"


def parse(raw: Any, source: str = "<config>") -> Config:
    if raw is None:
        raise ConfigError(source, ["the file is empty: it needs at least a routes list"])
    if not isinstance(raw, dict):
        raise ConfigError(source, ["the top level must be a mapping with a routes list"])
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key (check the spelling against the config reference)"
            problems.append(f"{_where(tuple(err['loc']), raw)}: {msg}")
        raise ConfigError(source, problems) from None


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
