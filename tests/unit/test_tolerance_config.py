"""`check` on `tolerance` and `changed_attributes`: what it takes, and what it refuses, in words."""

from __future__ import annotations

from typing import Any

import pytest

from pubsub_filter.core.attributes import MAX_ATTRIBUTES, MAX_NAME_BYTES
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.amounts import Amount, parse_amount
from pubsub_filter.core.config.schema import ConfigError, parse
from pubsub_filter.core.config.tolerance import MAX_ATTRIBUTES as RULES_MAX_ATTRIBUTES
from pubsub_filter.core.config.tolerance import MAX_NAME_BYTES as RULES_MAX_NAME_BYTES


def route(**kw: Any) -> dict[str, Any]:
    return {"routes": [{"name": "odds", "destination": "phase3", "key": ["payload.game_id"], **kw}]}


def problems(**kw: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(route(**kw))
    return str(caught.value)


def test_absolute_and_relative_amounts_are_taken() -> None:
    r = parse(route(tolerance={"price": 12, "line": 0.5, "total": "3%", "spread": "0.5 %"})).routes[0]
    assert [parse_amount(v) for v in r.tolerance.values()] == [
        Amount(12, False),
        Amount(0.5, False),
        Amount(3, True),
        Amount(0.5, True),
    ]


@pytest.mark.parametrize("amount", [-1, "abc", "-3%", True, None, "3", float("inf"), [1]])
def test_an_amount_that_is_not_a_non_negative_number_or_percentage_is_refused(amount: Any) -> None:
    assert "tolerance.price" in problems(tolerance={"price": amount})


def test_a_field_that_does_not_count_is_refused() -> None:
    said = problems(exclude=["ts"], tolerance={"ts": 1}, changed_attributes=["ts"])
    assert "tolerance: 'ts' does not count" in said and "changed_attributes: 'ts' does not count" in said
    assert "'x' does not count" in problems(include=["price"], tolerance={"x": 1})


def test_rows_routes_name_row_fields_and_need_a_row_key() -> None:
    parse(route(rows="payload.props", row_key=["player"], tolerance={"price": 1}, changed_attributes=["status"]))
    assert "needs row_key" in problems(rows="payload.props", tolerance={"price": 1})
    assert "row_key field" in problems(rows="payload.props", row_key=["player"], tolerance={"player": 1})


def test_other_schemes_are_refused() -> None:
    assert "scheme 'canonical' only" in problems(scheme="data_hash", tolerance={"price": 1})


def test_a_name_that_cannot_be_an_attribute_is_refused() -> None:
    assert "Pub/Sub takes names up to 256" in problems(changed_attributes=["x" * 250])
    assert "empty name" in problems(changed_attributes=[""])
    assert "listed twice" in problems(changed_attributes=["a", "a"])


def test_a_list_that_could_pass_the_attribute_limit_is_refused() -> None:
    names = [f"f{i}" for i in range(93)]
    parse(route(changed_attributes=names))  # 7 of the filter's own, and 93 flags: 100
    assert "list at most 93" in problems(changed_attributes=[*names, "one_more"])
    assert "list at most 88" in problems(
        rows="payload.props", row_key=["p"], rows_mode="changed", changed_attributes=names
    )


def test_the_flags_count_among_the_filters_own_attributes() -> None:
    r = parse(route(changed_attributes=["a", "b"])).routes[0]
    assert RouteRules(r).own_attributes_at_most == 9
    assert (RULES_MAX_ATTRIBUTES, RULES_MAX_NAME_BYTES) == (MAX_ATTRIBUTES, MAX_NAME_BYTES)


def test_a_field_written_as_a_path_is_refused_with_the_name_it_meant() -> None:
    # `payload.p` matches only a field literally named so: the tolerance and flag would never apply
    said = problems(tolerance={"payload.p": 5}, changed_attributes=["payload.s"])
    assert "tolerance: 'payload.p' is a path" in said and "did you mean 'p'?" in said
    assert "changed_attributes: 'payload.s' is a path" in said and "did you mean 's'?" in said
    on_rows = problems(rows="payload.props", row_key=["player"], tolerance={"payload.props.price": 5})
    assert "each row's fields" in on_rows and "did you mean 'price'?" in on_rows
    assert "'attributes.src' is a path" in problems(changed_attributes=["attributes.src"])
