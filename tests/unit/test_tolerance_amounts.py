"""A tolerance's amount against any number a producer can send: JSON integers decode exactly,
so a value past a double's range meets a fractional percentage. It is compared exactly and
decided, never raised out of the decision (a 5xx on every later message of the key)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from pubsub_filter.core.config.amounts import Amount
from pubsub_filter.core.config.schema import Route
from pubsub_filter.core.envelope import make_envelope
from tests.support.push_client import engine_on_sqlite, push_client

ROUTE = {
    "name": "totals",
    "destination": "phase3",
    "key": ["payload.game_id"],
    "tolerance": {"total": "2.5%"},
    "changed_attributes": ["total"],
}


@pytest.mark.parametrize(
    ("move", "last", "within"),
    [
        (10**398, 10**400, True),  # 1 % of it
        (10**399, 10**400, False),  # 10 %
        (25 * 10**397, 10**400, True),  # 2.5 % exactly
        (25 * 10**397 + 1, 10**400, False),
        (1, 40, True),
        (1.5, 40, False),
    ],
    ids=["1%", "10%", "2.5%", "just past 2.5%", "small within", "small beyond"],
)
def test_a_fractional_percentage_of_an_integer_past_a_doubles_range_is_exact(
    move: int | float, last: int, within: bool
) -> None:
    assert Amount(2.5, relative=True).allows(move, last) is within


def body(total: int, message_id: str) -> bytes:
    data = json.dumps({"game_id": "g1", "total": total}).encode()
    return make_envelope(data, message_id)


async def test_a_reference_past_a_doubles_range_leaves_every_later_message_of_its_key_decided(tmp_path: Path) -> None:
    async with push_client(engine_on_sqlite(tmp_path, {"routes": [ROUTE]})) as client:
        answers: list[httpx.Response] = []
        for n, total in enumerate([10**400, 5, 500, 500]):
            answers.append(await client.post("/push/totals", content=body(total, str(n))))
    assert [(r.status_code, r.json()["decision"]) for r in answers] == [
        (200, "forwarded"),
        (200, "forwarded"),
        (200, "forwarded"),
        (200, "suppressed"),
    ]


LAST = 327057656882052036  # past 2**53: a double cannot hold it, nor 2.5 % of it


@pytest.mark.parametrize(
    ("amount", "move", "last", "within"),
    [
        ("2.5%", 8176441422051301, LAST, False),  # the allowance is 8176441422051300.9
        ("2.5%", 8176441422051300, LAST, True),
        ("0.1%", 327057656882053, LAST, False),  # 327057656882052.036
        ("0.1%", 327057656882052, LAST, True),
        (0.1, 0.1, 0.7, True),  # 0.7 to 0.8 moves by 0.1 exactly (0.10000000000000009 in doubles)
        ("10%", 0.1, 1.0, True),
        ("10%", 0.1, 0.99, False),
        (1e-7, 1e-7, 2, True),
    ],
)
def test_every_comparison_is_exact_in_the_numbers_as_written(
    amount: int | float | str, move: int | float, last: int | float, within: bool
) -> None:
    from pubsub_filter.core.compare.tolerance import Tolerance

    route = {"name": "r", "destination": "phase3", "key": ["payload.k"], "tolerance": {"v": amount}}
    tol = Tolerance(Route.model_validate(route))
    new = (
        last + move
        if isinstance(move, int) and isinstance(last, int)
        else float(Decimal(repr(last)) + Decimal(repr(move)))
    )
    compared = tol.compare(tol.entry({"v": last}), tol.entry({"v": new}))
    assert compared.within is within


async def test_a_fractional_percentage_of_a_large_integer_forwards_a_move_just_past_it(tmp_path: Path) -> None:
    route = {**ROUTE, "tolerance": {"total": "2.5%"}}
    async with push_client(engine_on_sqlite(tmp_path, {"routes": [route]})) as client:
        answers = [
            (await client.post("/push/totals", content=body(total, str(n)))).json()["decision"]
            for n, total in enumerate([LAST, LAST + 8176441422051301, LAST + 8176441422051301 + 8176441422051300])
        ]
    assert answers == ["forwarded", "forwarded", "suppressed"]
