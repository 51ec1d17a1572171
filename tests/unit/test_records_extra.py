"""The `extra` column's JSON text: what orjson (`default=str`, `OPT_NON_STR_KEYS`) wrote, byte for byte.

The expected strings below are orjson 3.13's output for the same values: tables written
before the switch to msgspec must not see the column change shape.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import uuid

from pubsub_filter.backends.records.bigquery import to_row
from pubsub_filter.backends.records.extra import encode_extra
from pubsub_filter.core.model import Decision, DecisionRecord


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Tagged(str):
    def __str__(self) -> str:
        return "not this"


def test_plain_values_are_compact_json() -> None:
    assert encode_extra({"cause": "publish", "rows_changed": 2, "committed": False, "n": None}) == (
        '{"cause":"publish","rows_changed":2,"committed":false,"n":null}'
    )


def test_non_string_keys_become_strings_as_orjson_wrote_them() -> None:
    extra = {1: "int", 1.5: "float", None: "none", dt.date(2024, 1, 2): "date", Colour.RED: "enum"}
    assert encode_extra(extra) == '{"1":"int","1.5":"float","null":"none","2024-01-02":"date","red":"enum"}'


def test_a_bool_key_is_written_true_or_false() -> None:
    assert encode_extra({True: 1, False: 0}) == '{"true":1,"false":0}'


def test_float_keys_and_values_keep_orjsons_spelling() -> None:
    assert encode_extra({1.0: 1e16, 1e16: 1e-7, -0.0: 1.5e300}) == '{"1.0":1e+16,"1e+16":1e-7,"-0.0":1.5e+300}'


def test_nan_and_infinity_are_null() -> None:
    assert encode_extra({"a": float("nan"), "b": float("inf")}) == '{"a":null,"b":null}'


def test_values_json_has_no_type_for_are_written_with_str() -> None:
    extra = {"set": {1, 2}, "bytes": b"ab", "decimal": decimal.Decimal("1.50"), "object": object}
    assert encode_extra(extra) == '{"set":"{1, 2}","bytes":"b\'ab\'","decimal":"1.50","object":"<class \'object\'>"}'


def test_times_uuids_enums_tuples_and_dataclasses_keep_orjsons_forms() -> None:
    extra = {
        "utc": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        "naive": dt.datetime(2024, 1, 1, 1, 2, 3, 400),
        "offset": dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
        "time": dt.time(1, 2, 3),
        "uuid": uuid.UUID(int=1),
        "enum": Colour.RED,
        "intenum": Level.HIGH,
        "tuple": (1, "a"),
        "point": Point(1, 1e20),
    }
    assert encode_extra(extra) == (
        '{"utc":"2024-01-01T00:00:00+00:00","naive":"2024-01-01T01:02:03.000400",'
        '"offset":"2024-01-01T00:00:00+05:30","time":"01:02:03",'
        '"uuid":"00000000-0000-0000-0000-000000000001","enum":"red","intenum":3,'
        '"tuple":[1,"a"],"point":{"x":1,"y":1e+20}}'
    )


def test_a_str_subclass_is_written_as_its_characters_not_its_str() -> None:
    assert encode_extra({"tag": Tagged("x"), Tagged("k"): 1}) == '{"tag":"x","k":1}'


def test_nested_rows_changes_are_kept_as_they_are() -> None:
    extra = {"changes": [{"row": '["p1"]', "fields": ["reason", "status"]}], "rows_added": 0}
    assert encode_extra(extra) == '{"changes":[{"row":"[\\"p1\\"]","fields":["reason","status"]}],"rows_added":0}'


def test_a_key_orjson_refused_is_written_with_str_instead_of_failing_the_batch() -> None:
    assert encode_extra({(1, 2): "pair"}) == '{"(1, 2)":"pair"}'


def test_the_bigquery_row_carries_the_encoded_extra_and_none_when_empty() -> None:
    rec = DecisionRecord(0.0, "r", Decision.FORWARDED, True, "m", details={2: {3}})
    assert to_row(rec)["extra"] == '{"2":"{3}"}'
    assert to_row(DecisionRecord(0.0, "r", Decision.FORWARDED, True, "m"))["extra"] is None
