"""The one condition language (`pubsub_filter.core.compare.conditions`): a route's bypass rules and `replay --where`
decide alike, by the equality its docstring states."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.compare.conditions import holds, parse_where
from pubsub_filter.core.compare.fingerprint import NOT_JSON
from pubsub_filter.core.config.schema import Condition, ConfigError, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder


def rule(text: str) -> Condition:
    """A bypass condition as an operator writes it in the config's YAML."""
    route = {"name": "r", "destination": "out", "key": ["payload.id"], "bypass": yaml.safe_load(text)}
    return parse({"routes": [route]}).routes[0].bypass[0]


# --- equality ------------------------------------------------------------------------------


def test_numbers_compare_by_value() -> None:
    assert holds(rule("{field: payload.n, equals: 1}"), {"n": 1.0}, {})


def test_true_is_not_the_number_one() -> None:
    assert not holds(rule("{field: payload.live, equals: 1}"), {"live": True}, {})
    assert not holds(rule("{field: payload.live, in: [1, 2]}"), {"live": True}, {})


def test_an_attribute_meets_a_number_as_its_json_text() -> None:
    assert holds(rule("{field: attributes.version, equals: 2}"), {}, {"version": "2"})
    assert holds(rule("{field: attributes.version, equals: 2}"), {}, {"version": "2.0"})
    assert not holds(rule("{field: attributes.version, equals: 2}"), {}, {"version": "two"})


def test_an_attribute_meets_true_and_null_as_their_json_text() -> None:
    assert holds(rule("{field: attributes.live, equals: true}"), {}, {"live": "true"})
    assert holds(rule("{field: attributes.gone, in: [null]}"), {}, {"gone": "null"})
    assert not holds(rule("{field: attributes.live, equals: true}"), {}, {"live": "True"})


def test_strings_compare_as_written() -> None:
    assert holds(rule("{field: payload.s, equals: live}"), {"s": "live"}, {})
    assert not holds(rule("{field: payload.s, equals: live}"), {"s": "Live"}, {})


def test_a_yaml_date_is_the_text_it_was_written_as() -> None:
    assert holds(rule("{field: payload.game_date, equals: 2026-01-02}"), {"game_date": "2026-01-02"}, {})


def test_arrays_and_objects_compare_element_by_element() -> None:
    assert holds(rule("{field: payload.a, equals: [1, {b: true}]}"), {"a": [1.0, {"b": True}]}, {})
    assert not holds(rule("{field: payload.a, equals: [1, {b: true}]}"), {"a": [1, {"b": 1}]}, {})


def test_equals_null_is_a_test_of_its_own() -> None:
    assert holds(rule("{field: payload.x, equals: null}"), {"x": None}, {})
    assert not holds(rule("{field: payload.x, equals: null}"), {}, {})


# --- missing fields --------------------------------------------------------------------------


def test_a_missing_field_equals_nothing_and_not_equals_holds() -> None:
    assert not holds(rule("{field: payload.x, equals: 1}"), {}, {})
    assert not holds(rule("{field: payload.x, in: [1]}"), {}, {})
    assert holds(rule("{field: payload.x, not_equals: 1}"), {}, {})


def test_a_payload_that_is_not_json_has_no_payload_fields() -> None:
    assert not holds(rule("{field: payload, exists: true}"), NOT_JSON, {})
    assert holds(rule("{field: payload.x, not_equals: 1}"), NOT_JSON, {})


def test_not_equals_is_the_opposite_of_equals_on_a_present_field() -> None:
    assert holds(rule("{field: payload.s, not_equals: live}"), {"s": "final"}, {})
    assert not holds(rule("{field: payload.s, not_equals: live}"), {"s": "live"}, {})


def test_a_condition_with_two_tests_is_refused() -> None:
    with pytest.raises(ConfigError, match="exactly one of equals, in, exists, not_equals"):
        rule("{field: payload.s, equals: a, not_equals: b}")


# --- --where -------------------------------------------------------------------------------


def test_where_reads_a_json_value_as_json_and_other_text_as_text() -> None:
    assert parse_where("payload.n=2").equals == 2
    assert parse_where('payload.s="2"').equals == "2"
    assert parse_where("payload.game_date=2026-01-02").equals == "2026-01-02"
    assert parse_where("attributes.x=NaN").equals == "NaN"


def test_where_not_equals_is_the_not_equals_test() -> None:
    cond = parse_where("payload.n!=4")
    assert "not_equals" in cond.model_fields_set and cond.not_equals == 4


@pytest.mark.parametrize(("text", "error"), [("payload.n", "write attributes.NAME=VALUE"), ("body.x=1", "payload")])
def test_a_malformed_where_says_how_to_write_it(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_where(text)


# --- the engine's bypass rules use it ---------------------------------------------------------


async def test_a_bypass_rule_with_a_number_holds_for_the_attribute_that_text(tmp_path: Path) -> None:
    route = {
        "name": "r",
        "destination": "out",
        "key": ["payload.id"],
        "bypass": {"field": "attributes.priority", "equals": 1},
    }
    cfg = parse({"routes": [route]})
    store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors)
    engine = Engine(cfg, store, MemoryPublisher(), MemoryRecorder(), ManualClock(), "one")
    urgent = {"priority": "1"}
    await engine.handle("r", Message(b'{"id": 1}', urgent, "m1", None))
    again = (await engine.handle("r", Message(b'{"id": 1}', urgent, "m2", None))).record
    await engine.close()
    assert (again.decision, again.reason) == (Decision.FORWARDED, "bypass rule")


# --- one language: --where text and YAML decide alike -------------------------------------------

FIELDS = ["payload.a", "payload.b.c", "attributes.a", "attributes.k"]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, 2.0, -1.0, 1e20]),
    st.sampled_from(["", "a", "live", "2", "2.0", "true", "null", "1e3", " 2", "a=b", "x y", '"q"']),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=2))
TEXTS = SCALARS.map(lambda v: v if isinstance(v, str) else json.dumps(v))


def where_text(field: str, negate: bool, value: Any) -> str:
    """The --where an operator writes for `value`: a string as it is, unless it would read as JSON."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            written = value
        else:
            written = json.dumps(value)
    else:
        written = json.dumps(value)
    return f"{field}{'!=' if negate else '='}{written}"


@settings(max_examples=400, deadline=None)
@given(
    field=st.sampled_from(FIELDS),
    negate=st.booleans(),
    value=VALUES,
    payload=st.one_of(
        st.just(NOT_JSON),
        st.fixed_dictionaries({}, optional={"a": VALUES, "b": st.fixed_dictionaries({}, optional={"c": VALUES})}),
    ),
    attributes=st.dictionaries(st.sampled_from(["a", "k"]), TEXTS, max_size=2),
)
def test_a_where_and_the_same_yaml_condition_decide_alike(
    field: str, negate: bool, value: Any, payload: Any, attributes: dict[str, str]
) -> None:
    test = "not_equals" if negate else "equals"
    from_yaml = rule(yaml.safe_dump({"field": field, test: value}))
    from_where = parse_where(where_text(field, negate, value))
    assert holds(from_where, payload, attributes) == holds(from_yaml, payload, attributes)
