"""Golden vectors: fingerprint values users have stored must never change (README, "Fingerprints").

tests/golden/fingerprints.json holds, per vector, the route settings, the payload exactly as
the producer sent it (text, or base64 for bytes that are not UTF-8) and the expected value.
Every vector is computed through the public API; any difference names the vector. A
changed value is a breaking change: fix the code, do not edit the file. A new vector's
value comes from the failure message, after checking it by hand as below.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.compare.fingerprint import NOT_JSON, compile_scheme, message_fingerprint
from pubsub_filter.core.config.schema import Route
from tests.support.seeds import SmartIdempotencyMixin

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "fingerprints.json"
VECTORS: list[dict[str, Any]] = json.loads(GOLDEN.read_text(encoding="utf-8"))["vectors"]
BY_NAME = {v["name"]: v for v in VECTORS}


def data_of(vector: dict[str, Any]) -> bytes:
    if "data_base64" in vector:
        return base64.b64decode(vector["data_base64"], validate=True)
    return str(vector["data"]).encode("utf-8")


def route_of(vector: dict[str, Any]) -> Route:
    return Route.model_validate({"name": "golden", "destination": "phase3", **vector["route"]})


def computed(vector: dict[str, Any]) -> tuple[str, bool]:
    """(fingerprint, whether the payload was taken as raw bytes), through the public API."""
    data = data_of(vector)
    if vector["kind"] == "message":
        return message_fingerprint(data, vector["attributes"]), False
    payload, value = compile_scheme(route_of(vector))(data)
    return value, payload is NOT_JSON


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_the_file_pins_enough_distinct_vectors() -> None:
    assert len(VECTORS) >= 50
    assert len(BY_NAME) == len(VECTORS), "vector names must be unique"
    schemes = {v["route"].get("scheme", "canonical") for v in VECTORS if v["kind"] == "payload"}
    assert schemes == {"canonical", "data_hash", "event"}
    assert any(v["kind"] == "message" for v in VECTORS) and any(v.get("raw") for v in VECTORS)


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_golden_vector_is_unchanged(vector: dict[str, Any]) -> None:
    value, raw = computed(vector)
    assert value == vector["expected"], (
        f"golden vector {vector['name']!r} changed: expected {vector['expected']}, got {value}. "
        "Stored fingerprints would no longer match: this is a breaking change (README, Fingerprints)."
    )
    assert raw == vector.get("raw", False), f"golden vector {vector['name']!r}: raw bytes is now {raw}"


RELATED = [v for v in VECTORS if "same_as" in v or "differs_from" in v]


@pytest.mark.parametrize("vector", RELATED, ids=[v["name"] for v in RELATED])
def test_golden_vectors_keep_the_relations_the_rules_promise(vector: dict[str, Any]) -> None:
    # Independent of the pinned values: spellings the README calls one value are one value.
    if "same_as" in vector:
        assert vector["expected"] == BY_NAME[vector["same_as"]]["expected"]
    if "differs_from" in vector:
        assert vector["expected"] != BY_NAME[vector["differs_from"]]["expected"]


def _data_hash_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(BY_NAME["data_hash/rows"]["data"])["rows"]
    return rows


#: Vectors checked against text written out by hand (or the seeds' own code), not against this code.
BY_HAND: dict[str, bytes] = {
    "canonical/object": b'{"a":"x","b":[1,2],"k":1}',
    "canonical/include": b'{"a":"x"}',
    "canonical/include-field-missing": b"{}",
    "canonical/include-field-null": b'{"a":null}',
    "canonical/top-level-list": b'["x",3,null,{"a":1},{"b":2}]',
    "number/1e20": b'{"k":1,"v":100000000000000000000}',
    "number/2^53+1-as-float": b'{"k":1,"v":9007199254740993}',
    "number/2^53+1.5": b'{"k":1,"v":9007199254740994}',
    "number/25.50": b'{"k":1,"v":25.5}',
    "number/1.5E-7": b'{"k":1,"v":1.5e-7}',
    "number/1e-400": b'{"k":1,"v":0}',
    "unicode/nfd-raw": '{"k":1,"s":"cafe\u0301"}'.encode(),
    "unicode/astral-escaped": '{"k":1,"s":"\U0001f600 \U0001d11e"}'.encode(),
    "unicode/escapes": b'{"k":1,"s":"a\\"b\\\\c/d\\n\\t\\u0000\\u001f' + "\u2028".encode() + b'"}',
    "rows/fast": b'[{"game":1,"id":"a","status":"in"},{"game":2,"id":"b","status":"out"}]',
    "rows/duplicate-row-keys": b'[{"game":1,"id":"a","status":"in"},{"game":1,"id":"a","status":"out"}]',
    # a row key that does not apply to every row: rows ordered by (key text, row text)
    "rows/non-object-rows": b'[{"game":1,"id":"a","status":"in"},"x",3,[1],null]',
    "rows/missing-field": b'[{"game":1,"id":"a"}]',
    "rows/whole-payload-list": b'[{"id":1,"v":"a"},{"id":2,"v":"b"}]',
    "raw/binary": b"\x00\xffnot json\x80",
    "number/1e400-raw": b'{"k": 1, "v": 1e400}',
    "message/data-and-attributes": (8).to_bytes(8, "big") + b'{"k": 1}' + b'{"run":"7","source":"scraper"}',
    "message/empty": (0).to_bytes(8, "big") + b"{}",
    "data_hash/rows": b"True|2025-11-20|1|100\n2025-11-20|2|None|25.0",
    "event/default-fields": json.dumps(
        [
            ["2025-01-09T10:00:00+00:00", "a", "p", "buy", "101.50", 3, "fill"],
            ["2025-01-09T10:00:01+00:00", "b", "p", "sell", "99.0", 1, "fill"],
        ]
    ).encode(),
}


@pytest.mark.parametrize("name", BY_HAND)
def test_golden_vector_matches_its_hand_written_canonical_text(name: str) -> None:
    assert BY_NAME[name]["expected"] == sha(BY_HAND[name])


def test_golden_data_hash_vector_is_seed_002s_own_value() -> None:
    expected = SmartIdempotencyMixin(["id", "game_date"]).compute_data_hash(_data_hash_rows())
    assert BY_NAME["data_hash/rows"]["expected"] == "sha256:" + expected
