"""The one condition language: a route's `bypass` rules and `pubsub-filter replay --where`.

A condition (`config.Condition`) reads one field, `attributes.NAME` or `payload.a.b`
(`pubsub_filter.core.paths`), and makes one test: `equals` V, `not_equals` V, `in` [V, ...] or
`exists` true/false. In the config:

    bypass: {field: payload.state, equals: live}

On the command line `--where FIELD=VALUE` is `equals` and `--where FIELD!=VALUE` is
`not_equals`. VALUE is read as JSON when it is JSON (`2`, `true`, `null`, `"quoted"`,
`[1, 2]`), otherwise it is the text as written (`payload.game_date=2026-01-02`).

Equality is the same on both surfaces:

- a missing field, or any payload field of a payload that is not JSON, equals nothing:
  `equals` and `in` fail, `not_equals` holds, `exists: false` holds;
- JSON values compare as JSON: numbers by value (1 equals 1.0), `true`/`false` are not
  numbers (true does not equal 1), arrays and objects element by element;
- a string meets a number, `true`, `false` or `null` as JSON text read back: the attribute
  `"2"` equals 2 and 2.0, `"true"` equals true, `"null"` equals null. Attributes are always
  strings, so without this rule `equals: 2` on an attribute could never hold in the config
  while `--where attributes.n=2` matched `"2"`;
- a date the YAML loader made of `2026-01-02` is that text, as `--where` reads it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any

from pubsub_filter.core.compare.fingerprint import NOT_JSON
from pubsub_filter.core.config.schema import Condition
from pubsub_filter.core.paths import MISSING, Path, PathError

_WHERE = re.compile(r"^\s*([^!=\s]+)\s*(!=|=)(.*)$", re.DOTALL)
_UNREADABLE: Any = object()


def holds(cond: Condition, payload: Any, attributes: Mapping[str, str]) -> bool:
    """Does the message (its decoded payload, or `NOT_JSON`, and its attributes) pass `cond`?"""
    found = (
        MISSING if (cond.field.root == "payload" and payload is NOT_JSON) else cond.field.resolve(payload, attributes)
    )
    if cond.exists is not None:
        return (found is not MISSING) == cond.exists
    if cond.one_of is not None:
        return found is not MISSING and any(equal(found, v) for v in cond.one_of)
    if "not_equals" in cond.model_fields_set:
        return found is MISSING or not equal(found, cond.not_equals)
    return found is not MISSING and equal(found, cond.equals)


def parse_where(text: str) -> Condition:
    """`attributes.NAME=VALUE`, `payload.a.b=VALUE` or the same with `!=` → the condition it means."""
    m = _WHERE.match(text)
    if not m:
        raise ValueError("write attributes.NAME=VALUE or payload.a.b=VALUE (or !=)")
    try:
        field = Path.parse(m.group(1))
    except PathError as exc:
        raise ValueError(str(exc)) from None
    test = "not_equals" if m.group(2) == "!=" else "equals"
    return Condition.model_validate({"field": field, test: _read(m.group(3))})


def equal(found: Any, wanted: Any) -> bool:
    """The equality of the module docstring, between a field's value and a condition's."""
    if isinstance(wanted, dt.date) and not isinstance(wanted, dt.datetime):
        wanted = wanted.isoformat()
    if isinstance(found, str) is not isinstance(wanted, str):
        text, other = (found, wanted) if isinstance(found, str) else (wanted, found)
        if other is None or isinstance(other, (bool, int, float)):
            return _same(_read(text, _UNREADABLE), other)
        return False
    return _same(found, wanted)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    return type(a) is type(b) and bool(a == b)


def _refuse(constant: str) -> Any:
    raise ValueError(constant)  # NaN and Infinity are not JSON: such text stays text


def _read(text: str, otherwise: Any = None) -> Any:
    """`text` as JSON when it is JSON; else `otherwise`, or the text itself."""
    try:
        return json.loads(text, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return text if otherwise is None else otherwise
