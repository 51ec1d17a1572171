"""The text of a decision record's `extra` column: JSON, with msgspec (a runtime dependency).

The BigQuery backend wrote this column with orjson (`default=str`, `OPT_NON_STR_KEYS`),
which only the test extra installs. The text must not change under tables that already
hold it, so values are first turned into what orjson would have written and then encoded
by msgspec:

- dict keys that are not strings become strings (`1` → "1", `True` → "true", `None` →
  "null", `1.5` → "1.5", dates in ISO 8601, enums by value); a key orjson refused (a
  tuple, say) is written with `str()` instead of failing the whole batch;
- values JSON has no type for are written with `str()` (a set, bytes, a Decimal), while
  datetimes, dates, times, UUIDs, enums and dataclasses keep orjson's own forms;
- floats keep orjson's spelling (`1e+16`, where msgspec writes `1e16`); NaN and infinities
  are `null` in both.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec

from pubsub_filter.core.escaped import escaped


def _float(value: float) -> msgspec.Raw:
    text = msgspec.json.encode(value)
    # Both libraries write the shortest round-trip digits; only the exponent sign differs.
    e = text.find(b"e")
    if e >= 0 and text[e + 1 : e + 2] != b"-":
        text = text[: e + 1] + b"+" + text[e + 1 :]
    return msgspec.Raw(text)


def _key(key: Any) -> str:
    if isinstance(key, enum.Enum):
        return _key(key.value)
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        return bytes(_float(key)).decode()
    if key is None:
        return "null"
    if isinstance(key, dt.date | dt.time):
        return key.isoformat()
    return str(key)


def _value(value: Any) -> Any:
    if value is None or value.__class__ in (str, int, bool):
        return value
    if isinstance(value, enum.Enum):
        return _value(value.value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, dict):
        return {_key(k): _value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_value(v) for v in value]
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return str(value)


def encode_extra(extra: Mapping[str, Any]) -> str:
    """`extra` as compact JSON text, byte for byte what orjson wrote before (see the module doc);
    text that cannot be written as UTF-8 (a lone surrogate) escaped, never the row lost."""
    value = _value(dict(extra))
    try:
        return msgspec.json.encode(value).decode()
    except UnicodeEncodeError:
        return msgspec.json.encode(escaped(value)).decode()
