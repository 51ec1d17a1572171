"""`tune` on numbers: how far they move between forwards, and the what-if of a tolerance, checked
against what a route with that tolerance actually decides on the same messages."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.cli import main
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, DecisionRecord, Message
from pubsub_filter.core.ports import DecisionRow
from pubsub_filter.tools.tune import analyse, render
from pubsub_filter.tools.tune_moves import parse_tolerances
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder

ROUTE = {"destination": "phase3", "key": ["payload.game_id"], "exclude": ["scraped"]}
ROUTES = [
    {"name": "plain", **ROUTE},
    {"name": "tol12", **ROUTE, "tolerance": {"price": 12}},
    {"name": "tol3pct", **ROUTE, "tolerance": {"price": "3%"}},
    {
        "name": "rows",
        "destination": "phase3",
        "key": ["payload.game_id"],
        "rows": "payload.props",
        "row_key": ["player"],
    },
]


def rows_of(records: list[DecisionRecord]) -> list[DecisionRow]:
    return [
        {
            "time": r.time,
            "decision": str(r.decision),
            "enforced": r.enforced,
            "key": r.key,
            "reason": r.reason,
            "fingerprint": r.fingerprint,
            "previous_fingerprint": r.previous_fingerprint,
            "extra": dict(r.extra),
        }
        for r in records
    ]


async def decided(tmp_path: Path, route: str, payloads: list[dict[str, Any]]) -> list[DecisionRecord]:
    recorder = MemoryRecorder()
    engine = Engine(parse({"routes": ROUTES}), SqliteStore(tmp_path / f"{route}.db"), MemoryPublisher(), recorder)
    engine.clock = ManualClock()
    for i, p in enumerate(payloads):
        await engine.handle(route, Message(json.dumps(p).encode(), {}, f"m{i}"))
    await engine.store.close()
    return recorder.records


def walk(seed: int, n: int = 300) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    price, status, out = 100, "open", []
    for i in range(n):
        price += rng.choice((-5, -3, 0, 2, 4, 6, 15, -25)) if rng.random() < 0.8 else 0
        if rng.random() < 0.05:
            status = "closed" if status == "open" else "open"
        game = rng.choice(("g1", "g2"))
        out.append({"game_id": game, "price": price, "status": status, "scraped": str(i)})
    return out


@pytest.mark.parametrize(("route", "amount"), [("tol12", "12"), ("tol3pct", "3%")])
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_what_if_skip_rate_is_what_the_tolerance_decides(
    tmp_path: Path, route: str, amount: str, seed: int
) -> None:
    payloads = walk(seed)
    plain = rows_of(await decided(tmp_path, "plain", payloads))
    actual = await decided(tmp_path, route, payloads)
    a = analyse(plain, tolerance=parse_tolerances([f"price={amount}"]))
    assert a.evaluable == a.decided == len(payloads)
    skipped = sum(r.decision is not Decision.FORWARDED for r in actual)
    assert a.would_skip == skipped
    assert a.skipped < skipped  # the tolerance does hold some back


async def test_moves_between_forwards_are_shown_per_number(tmp_path: Path) -> None:
    prices = [100, 104, 110, 120, 90]
    payloads = [{"game_id": "g1", "price": p, "scraped": str(i)} for i, p in enumerate(prices)]
    a = analyse(rows_of(await decided(tmp_path, "plain", payloads)))
    (price,) = a.moves
    assert (price.name, price.forwards, price.alone, price.p50, price.max) == ("price", 4, 4, 6, 30)
    text = render("plain", a, "table")
    assert "how far numbers moved between forwards" in text and "price" in text


async def test_a_row_route_says_plainly_that_no_values_are_recorded(tmp_path: Path) -> None:
    payloads = [{"game_id": "g1", "props": [{"player": "p", "price": p}]} for p in (100, 104, 130)]
    a = analyse(rows_of(await decided(tmp_path, "rows", payloads)), tolerance=parse_tolerances(["price=12"]))
    assert not a.values_recorded and a.moves == ()
    assert a.would_skip == a.skipped  # nothing evaluated as held back
    assert "row route, whose records keep no values" in render("rows", a, "table")
    assert "--tolerance cannot be evaluated" in render("rows", a, "table")


@pytest.mark.parametrize("given", ["price", "price=abc", "=3", "price=-1"])
def test_a_tolerance_that_is_not_field_equals_amount_is_a_usage_error(
    given: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "d.log"
    log.write_text("")
    assert main(["tune", "--route", "plain", "--log", str(log), "--tolerance", given]) == 2
    assert "--tolerance" in capsys.readouterr().err
