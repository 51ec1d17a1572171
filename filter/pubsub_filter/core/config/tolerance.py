"""The config rules of `tolerance` and `changed_attributes` (checked with the others, `rules`).

Both name fields the way `include` and `exclude` do (fields of each row when `rows` is set,
else top-level fields of the payload), and both need a field that counts: a tolerance on an
excluded field, or a flag for one, could never apply. They need the canonical scheme (numbers
by value) and, on a rows route, a `row_key` (rows are matched by key). A flag is an attribute,
so its name must be one Pub/Sub takes, and the list, with the filter's own attributes, must
fit Pub/Sub's limit on how many a message carries.
"""

from __future__ import annotations

from typing import Any

from pubsub_filter.core.attributes import CHANGED_PREFIX, own_attribute_count
from pubsub_filter.core.pubsub_limits import MAX_ATTRIBUTES, MAX_NAME_BYTES

Problem = tuple[tuple[Any, ...], str]


def tolerance_rules(raw: dict[str, Any]) -> list[Problem]:
    routes = raw.get("routes")
    found: list[Problem] = []
    for i, route in enumerate(routes if isinstance(routes, list) else []):
        if isinstance(route, dict):
            found += _route(i, route)
    return found


def _names(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [k for k in value if isinstance(k, str)]
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _route(i: int, route: dict[str, Any]) -> list[Problem]:
    found: list[Problem] = []
    include, exclude = set(_names(route.get("include"))), set(_names(route.get("exclude")))
    row_key = set(_names(route.get("row_key")))
    has_rows = route.get("rows") is not None
    for key in ("tolerance", "changed_attributes"):
        names = _names(route.get(key))
        if not names:
            continue
        where = ("routes", i, key)
        if route.get("scheme", "canonical") != "canonical":
            found.append((where, f"{key} works with scheme 'canonical' only: it compares numbers by value"))
        if has_rows and not row_key:
            found.append((where, f"{key} on a rows route needs row_key: rows are compared by their key"))
        for name in names:
            if (meant := _field_meant(name, route.get("rows"))) is not None:
                found.append((where, meant))
                continue
            if name in exclude or (include and name not in include):
                found.append(
                    (where, f"{name!r} does not count for this route (see include/exclude): {key} names counted fields")
                )
        if key == "tolerance":
            found += [
                (where, f"{n!r} is a row_key field: a row's key is compared exactly") for n in names if n in row_key
            ]
        else:
            found += _attribute_names(where, names, route.get("rows_mode") == "changed")
    return found


def _field_meant(name: str, rows: Any) -> str | None:
    """Why `name`, written as a path (`payload.p`), matches no field: these name fields as
    `include` does, by name; the field the path reaches, as a "did you mean". None: a name."""
    prefix = f"{rows}." if isinstance(rows, str) and rows != "payload" else "payload."
    if not name.startswith(("payload.", "attributes.")):
        return None
    where = "each row's fields" if isinstance(rows, str) else "the payload's top-level fields"
    meant = name.removeprefix(prefix) if name.startswith(prefix) else None
    guess = f"; did you mean {meant!r}?" if meant and "." not in meant else ""
    return f"{name!r} is a path: this names one of {where} by its name, as include does{guess}"


def _attribute_names(where: tuple[Any, ...], names: list[str], rows_changed: bool) -> list[Problem]:
    found: list[Problem] = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            found.append((where, f"{name!r} is listed twice"))
        seen.add(name)
        size = len((CHANGED_PREFIX + name).encode("utf-8", "surrogatepass"))
        if not name:
            found.append((where, "an empty name cannot be an attribute"))
        elif size > MAX_NAME_BYTES:
            found.append(
                (
                    where,
                    f"{CHANGED_PREFIX}{name[:40]}... is {size} bytes: Pub/Sub takes names up to {MAX_NAME_BYTES}",
                )
            )
    own = own_attribute_count(rows_changed, 0)
    if len(seen) + own > MAX_ATTRIBUTES:
        found.append(
            (
                where,
                f"{len(seen)} flags and the filter's own attributes (up to {own} on this route) pass Pub/Sub's limit "
                f"of {MAX_ATTRIBUTES} attributes a message: list at most {MAX_ATTRIBUTES - own}",
            )
        )
    return found
