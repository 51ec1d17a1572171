"""Rules across the config's keys, checked beside the field errors (`pubsub_filter.core.config.schema.parse`).

Each reads the raw mapping leniently: a value of the wrong type is skipped here (its
field error is reported by the model), so one broken key hides no other problem.
"""

from __future__ import annotations

import os
from typing import Any

from pubsub_filter.core.config.coalesce import coalesce_rules
from pubsub_filter.core.config.push_format import attribute_names_problem, raw_paths
from pubsub_filter.core.config.sections import (
    STATE_TTL,
    LeaseConfig,
    OutboxConfig,
    SqliteRecordsConfig,
    SqliteStoreConfig,
    StoreErrors,
    lease_out_of_order,
    loud_decisions_quieted,
)
from pubsub_filter.core.config.tolerance import tolerance_rules
from pubsub_filter.core.escaped import encodable, unwritable
from pubsub_filter.core.times import parse_duration

Problem = tuple[tuple[Any, ...], str]

_DEFAULT_SQLITE = {"store": SqliteStoreConfig().path, "records": SqliteRecordsConfig().path}


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


def rules(raw: dict[str, Any]) -> list[Problem]:
    """Every problem across keys, each as (pydantic-style location, message)."""
    return [
        *_text_rules(raw, ()),
        *_route_rules(raw),
        *tolerance_rules(raw),
        *_timing_rules(raw),
        *_auth_rules(raw),
        *_file_rules(raw),
        *_decision_logs_rules(raw),
        *coalesce_rules(raw),
    ]


def _text_rules(value: Any, loc: tuple[Any, ...]) -> list[Problem]:
    """Every string, key or value, at any depth, must be text UTF-8 can write: it may become an
    attribute name, and it reaches log lines and records (a file's own are refused on their line
    as it is read, `yamlfile`; this covers a config built in code). Walked with a stack, not by
    recursion: a config nested past Python's recursion limit is checked too."""
    found: list[Problem] = []
    todo: list[tuple[Any, tuple[Any, ...]]] = [(value, loc)]
    seen: set[int] = set()  # a YAML alias can make a list or mapping hold itself: each is walked once
    while todo:
        item, at = todo.pop()
        if isinstance(item, str):
            if not encodable(item):
                found.append((at, unwritable(item)))
            continue
        if not isinstance(item, dict | list | tuple) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            for k, v in item.items():
                if isinstance(k, str) and not encodable(k):
                    found.append((at, f"a key: {unwritable(k)}"))
                todo.append((v, (*at, k)))
        elif isinstance(item, list | tuple):
            todo.extend((v, (*at, i)) for i, v in enumerate(item))
    return found


def _decision_logs_rules(raw: dict[str, Any]) -> list[Problem]:
    refused = loud_decisions_quieted(raw.get("decision_logs"))
    return [(("decision_logs",), refused)] if refused else []


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
        push_format = route.get("push_format", "wrapped")
        unreadable = attribute_names_problem(push_format, raw_paths(route)) if isinstance(push_format, str) else None
        if unreadable:
            found.append((("routes", i), unreadable))
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
    ttl = _seconds(raw, "state_ttl", STATE_TTL)
    heartbeat = _seconds(lease, "heartbeat", defaults_lease.heartbeat)
    found: list[Problem] = []
    if duration is not None and ack is not None and heartbeat is not None:
        out_of_order = lease_out_of_order(duration, ack, heartbeat)
        found += [(("lease",), out_of_order)] if out_of_order else []
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


#: The files SQLite keeps beside a database: the outbox on one of them corrupts the database too.
_SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file, however spelled: by identity (device and inode) when
    both exist, which sees hard links too; else by their paths with symlinks resolved."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # one does not exist yet (or the path cannot be one: a NUL byte)
        pass
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return os.path.normpath(a) == os.path.normpath(b)


def _file_rules(raw: dict[str, Any]) -> list[Problem]:
    """The outbox appends JSON lines: on a SQLite file (or one of its side files) it would corrupt the database."""
    outbox = _section(raw, "publisher")
    if outbox.get("backend", "outbox") != "outbox":
        return []
    path = outbox.get("path", OutboxConfig().path)
    if not (isinstance(path, str) and path):
        return []
    found: list[Problem] = []
    for section in ("store", "records"):
        other = _section(raw, section)
        other_path = other.get("path", _DEFAULT_SQLITE[section])
        if other.get("backend", "sqlite") != "sqlite" or not (isinstance(other_path, str) and other_path):
            continue
        if _same_file(path, other_path):
            found.append((("publisher", "path"), f"{path!r} is also {section}.path: give the outbox its own file"))
            continue
        side = next((s for s in _SQLITE_SIDE_FILES if _same_file(path, other_path + s)), None)
        if side is not None:
            found.append(
                (
                    ("publisher", "path"),
                    f"{path!r} is also {section}.path's {other_path}{side}: give the outbox its own file",
                )
            )
    return found
