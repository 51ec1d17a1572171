"""The YAML config: routes and backends, validated on load with errors that name file, route and key.

The file stays plain YAML (no tags, anchors optional) because Terraform reads the same
file with `yamldecode` to provision subscriptions and topics.

This module holds the routes, the `Config` root, `parse` and `load`; the other sections
are `pubsub_filter.core.config.sections` and the rules across keys `pubsub_filter.core.config.rules`.
Every section stays importable from here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path as FsPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from pubsub_filter.core.config import yamlfile
from pubsub_filter.core.config.amounts import parse_amount
from pubsub_filter.core.config.coalesce import Coalesce
from pubsub_filter.core.config.errors import describe, plain_loc, where
from pubsub_filter.core.config.lines import NO_LINES, Lines, Located, Position, in_line_order
from pubsub_filter.core.config.names import Kind, check_name
from pubsub_filter.core.config.push_format import attribute_names_problem
from pubsub_filter.core.config.rules import rules
from pubsub_filter.core.config.sections import (
    STATE_TTL,
    AuthConfig,
    BigqueryRecordsConfig,
    DecisionLog,
    DecisionLogs,
    Duration,
    FirestoreStoreConfig,
    LeaseConfig,
    OutboxConfig,
    PubsubPublisherConfig,
    PullConfig,
    ServerConfig,
    SqliteRecordsConfig,
    SqliteStoreConfig,
    StoreErrors,
    Strict,
    TelemetryConfig,
)
from pubsub_filter.core.errors import FilterError
from pubsub_filter.core.paths import Path, PathError

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "AuthConfig",
    "BigqueryRecordsConfig",
    "Coalesce",
    "Condition",
    "Config",
    "ConfigError",
    "DecisionLog",
    "DecisionLogs",
    "FirestoreStoreConfig",
    "LeaseConfig",
    "OutboxConfig",
    "PubsubPublisherConfig",
    "PullConfig",
    "Route",
    "ServerConfig",
    "SqliteRecordsConfig",
    "SqliteStoreConfig",
    "StoreErrors",
    "TelemetryConfig",
    "load",
    "load_located",
    "parse",
]

CONFIG_ENV = "PUBSUB_FILTER_CONFIG"
DEFAULT_CONFIG = "filter.yaml"


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


def _amount(value: Any) -> Any:
    parse_amount(value)  # raises ValueError, worded for the user
    return value


#: A tolerance: a non-negative number, or a percentage such as "3%" (`pubsub_filter.core.compare.tolerance`).
ToleranceAmount = Annotated[int | float | str, BeforeValidator(_amount)]


class Condition(Strict):
    """A condition on one field: equals a value (or not), is one of several, or is present.

    What each test means, on a route's `bypass` and on `replay --where`: `pubsub_filter.core.compare.conditions`.
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


class Route(Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    subscription: Annotated[str | None, _pubsub_name("subscription")] = None
    destination: Annotated[str, _pubsub_name("topic")]
    key: list[FieldPath] = Field(min_length=1)
    rows: FieldPath | None = None
    row_key: list[str] = []
    include: list[str] = []
    exclude: list[str] = []
    # a deadband per numeric field, and the fields a forward flags as changed (`pubsub_filter.core.compare.tolerance`)
    tolerance: dict[str, ToleranceAmount] = {}
    changed_attributes: list[str] = []
    window: Duration | None = None
    mode: Literal["enforce", "shadow"] = "enforce"
    scheme: Literal["canonical", "data_hash", "event"] = "canonical"
    on_store_error: Literal["forward", "retry"] = "forward"
    on_missing_key: Literal["forward", "reject"] = "forward"  # a key (or rows) that cannot be read
    stale: Literal["suppress", "forward"] = "suppress"
    # a selection that now compares fields the last forward's did not (`pubsub_filter.core.compare.reselect`)
    new_fields: Literal["forward", "adopt"] = "forward"
    bypass: list[Condition] = []
    rows_mode: Literal["whole", "changed"] = "whole"
    removed_rows: Literal["attribute", "tombstone", "ignore"] = "attribute"
    audit_sample: float = Field(default=0.0, ge=0.0, le=1.0)
    cache_result: bool = False  # in-process: keep the body's result, return it for a redelivery
    # What the route's push subscription sends (docs/deploying.md, "Payload unwrapping"):
    # Pub/Sub's envelope, or the data as the body with (`unwrapped`) or without the metadata headers.
    push_format: Literal["wrapped", "unwrapped", "unwrapped_no_metadata"] = "wrapped"
    # hold a burst of one key's messages, decide only its newest (`pubsub_filter.core.engine.coalesce`)
    coalesce: Coalesce | None = None

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
    def _header_attribute_names(self) -> Route:
        # the same words as the rule across keys (`push_format`), which parse says once
        problem = attribute_names_problem(self.push_format, [*self.key, *(c.field for c in self.bypass)])
        if problem:
            raise ValueError(problem)
        return self

    @property
    def enforced(self) -> bool:
        return self.mode == "enforce"


_DEFAULT_BACKENDS = {"store": "sqlite", "publisher": "outbox", "records": "sqlite"}
_SECTIONS = (*_DEFAULT_BACKENDS, "lease", "store_errors", "server", "auth", "pull", "telemetry", "decision_logs")


class Config(Strict):
    store: SqliteStoreConfig | FirestoreStoreConfig = Field(default_factory=SqliteStoreConfig, discriminator="backend")
    publisher: OutboxConfig | PubsubPublisherConfig = Field(default_factory=OutboxConfig, discriminator="backend")
    records: SqliteRecordsConfig | BigqueryRecordsConfig = Field(
        default_factory=SqliteRecordsConfig, discriminator="backend"
    )
    lease: LeaseConfig = Field(default_factory=LeaseConfig)
    store_errors: StoreErrors = Field(default_factory=StoreErrors)
    server: ServerConfig = Field(default_factory=ServerConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    pull: PullConfig = Field(default_factory=PullConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    decision_logs: DecisionLogs = Field(default_factory=DecisionLogs)
    project: str | None = None
    state_ttl: Duration = STATE_TTL
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


class ConfigError(FilterError):
    """Every problem found in one config file, each naming the file, route and key, and where the
    file says it (`filter.yaml:14:11: ...`) when it comes from a file.

    `problems` are their texts, `found` the same with their places, in line order."""

    def __init__(self, source: str, problems: Sequence[str | Located]):
        self.source = source
        self.found = tuple(in_line_order([p if isinstance(p, Located) else Located(p) for p in problems]))
        self.problems = [p.text for p in self.found]
        super().__init__("\n".join(self.said()))

    def said(self) -> list[str]:
        """One line per problem: `SOURCE:LINE:COLUMN: text`, or `SOURCE: text` where it has no place."""
        return [p.said(self.source) for p in self.found]


def parse(raw: Any, source: str = "<config>", lines: Lines = NO_LINES, *, also: Sequence[Located] = ()) -> Config:
    """Validate a decoded config: every problem at once, field errors and rules across keys alike,
    each placed by `lines` (a file's, from `yamlfile`; none for a config built in code), with
    `also` (what its file got wrong as YAML) among them."""
    found = list(also)
    if raw is None:
        raise ConfigError(source, [*found, Located("the file is empty: it needs at least a routes list")])
    if not isinstance(raw, dict):
        raise ConfigError(source, [*found, Located("the top level must be a mapping with a routes list", lines.of(()))])
    config = None
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        found += [
            Located(said.text, lines.of(said.loc, key=said.of_key)) for said in describe(exc.errors(), raw, Config)
        ]
    # Rules across keys run on whatever is readable, so they show up together with the field errors.
    found += [Located(f"{where(loc, raw)}: {msg}", lines.of(plain_loc(loc))) for loc, msg in rules(raw)]
    if found or config is None:
        raise ConfigError(source, found)
    return config


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """Load and validate a config file (default: $PUBSUB_FILTER_CONFIG, then ./filter.yaml)."""
    return load_located(path)[0]


def load_located(path: str | os.PathLike[str] | None = None) -> tuple[Config, Lines]:
    """`load`, and where the file says each thing: for problems found later (`check`'s files)."""
    src = str(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    try:
        text = FsPath(src).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(src, [f"no such file (set --config or ${CONFIG_ENV})"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(src, [f"cannot read it: {exc}"]) from None
    try:
        document = yamlfile.read(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = Position(mark.line + 1, mark.column + 1) if mark else None
        raise ConfigError(src, [Located(f"not valid YAML: {getattr(exc, 'problem', exc)}", at)]) from None
    if not document.readable:
        raise ConfigError(src, list(document.problems))
    return parse(document.data, src, document.lines, also=document.problems), document.lines
