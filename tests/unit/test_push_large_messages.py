"""Every push a valid message makes is read in full under the default `server.max_body`: 10 MB of
data in base64 with every `/` escaped, 100 of the widest attributes, the envelope's fields in both
spellings (27.4 MB). A body over the limit still gets one clear 413. The limit stays inside Cloud
Run's 32 MiB request."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.core.config.schema import load
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.pubsub_limits import CLOUD_RUN_HTTP1_REQUEST, DEFAULT_MAX_BODY, LARGEST_PUSH, MAX_DATA
from pubsub_filter.push import app as app_module
from pubsub_filter.push.app import LARGE_BODY, create_app
from pubsub_filter.runtime.otel import from_config
from pubsub_filter.runtime.wiring import make_engine
from tests.support.asgi import call
from tests.support.bursts import ROWS_ROUTE, rows_payload
from tests.support.large_push import escaped_envelope, largest_push, widest_attributes
from tests.support.serve import write_config

BIG = "a 10 MB message: its base64 and fingerprint take about 100 ms on the loop (docs/deploying.md)"


@pytest.fixture
async def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Engine, Any]]:
    """The embedded defaults (no `server` section) and a route keyed on an attribute, so any data goes."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "filter.yaml").write_text("routes:\n  - {name: raw, destination: out, key: [attributes.id]}\n")
    engine = make_engine(load(str(tmp_path / "filter.yaml")), from_config(metrics=False, traces=False, env={}))
    yield engine, create_app(engine)
    await engine.close()


def test_the_default_limit_takes_the_largest_push_and_fits_cloud_run() -> None:
    body = largest_push()
    assert len(body) <= LARGEST_PUSH <= DEFAULT_MAX_BODY < CLOUD_RUN_HTTP1_REQUEST
    assert LARGEST_PUSH - len(body) < 10_000  # the bound is the real worst case, not a guess far above it


@pytest.mark.loop_may_block(BIG)
async def test_the_largest_push_pubsub_can_send_is_read_in_full_not_refused_for_its_size(
    served: tuple[Engine, Any],
) -> None:
    engine, app = served
    assert engine.config.server.max_body == DEFAULT_MAX_BODY
    status, answer = await call(app, "POST", "/push/raw", largest_push())
    # read and parsed: what refuses it is its 100 attributes (no room for the filter's), not its size
    assert status == 400, answer[:300]
    reason = json.loads(answer)["reason"]
    assert reason.startswith("the message has 100 attributes"), reason


@pytest.mark.loop_may_block(BIG)
async def test_a_message_of_nearly_10_mb_pushed_at_its_most_escaped_is_forwarded(served: tuple[Engine, Any]) -> None:
    engine, app = served
    attributes = {"id": "k1", **widest_attributes(60)}
    data = b"\xff" * (MAX_DATA - 100_000)  # room for the attributes, the filter's own among them
    body = escaped_envelope(data, attributes)
    assert len(body) > 26_000_000  # twice the old 10 MiB default, and then some
    status, answer = await call(app, "POST", "/push/raw", body)
    assert (status, json.loads(answer)["decision"]) == (200, "forwarded"), answer[:300]
    await engine.close()  # the outbox has it all
    outbox = await asyncio.to_thread(os.path.getsize, "outbox.jsonl")
    assert outbox > len(data)


async def test_a_body_over_the_default_limit_gets_one_clear_413(served: tuple[Engine, Any]) -> None:
    _, app = served
    status, answer = await call(app, "POST", "/push/raw", b" " * (DEFAULT_MAX_BODY + 1))
    assert status == 413
    assert json.loads(answer) == {"decision": "rejected", "reason": f"body larger than {DEFAULT_MAX_BODY} bytes"}


@pytest.fixture
def row_pushes() -> tuple[bytes, bytes]:
    """Two pushes of the same 20,000 rows (2.5 MB), built before the test's loop runs."""
    data = rows_payload(20_000)
    return make_envelope(data, "m1", {"id": "k1"}), make_envelope(data, "m2", {"id": "k1"})


async def test_a_large_row_payload_is_decided_without_holding_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, row_pushes: tuple[bytes, bytes]
) -> None:
    # 20,000 rows: about 0.4 s of decoding and row digests, which on the loop would stall every other
    # request; the loop watch (tests/support/loopwatch.py) fails this test if one callback holds it 100 ms
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path / "filter.yaml", {"routes": [ROWS_ROUTE]})
    engine = make_engine(load(str(tmp_path / "filter.yaml")), from_config(metrics=False, traces=False, env={}))
    app = create_app(engine)
    try:
        status, answer = await call(app, "POST", "/push/rows", row_pushes[0])
        assert (status, json.loads(answer)["decision"]) == (200, "forwarded"), answer[:300]
        status, answer = await call(app, "POST", "/push/rows", row_pushes[1])
        assert (status, json.loads(answer)["decision"]) == (200, "suppressed"), answer[:300]
    finally:
        await engine.close()


async def test_large_pushes_that_end_together_are_decoded_one_per_turn_of_the_loop(
    served: tuple[Engine, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between one large body's decode and the next, the loop polls: the health probe's request,
    and every other connection's, is read between them (`pubsub_filter.push.turns`)."""
    _engine, app = served
    events: list[str] = []
    decode = app_module.parse_push

    def recorded(body: Any, *args: Any) -> Any:
        events.append(f"decode {len(body) >= LARGE_BODY}")
        return decode(body, *args)

    monkeypatch.setattr(app_module, "parse_push", recorded)
    ticking = True

    async def ticker() -> None:
        while ticking:
            events.append("tick")
            await asyncio.sleep(0)

    data = b"x" * LARGE_BODY
    pushes = [make_envelope(data, f"m{i}", {"id": f"k{i}"}) for i in range(4)]
    small = make_envelope(b"{}", "s1", {"id": "s"})
    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    answers = await asyncio.gather(*(call(app, "POST", "/push/raw", body) for body in [*pushes, small]))
    ticking = False
    await tick
    assert [status for status, _ in answers] == [200] * 5
    decodes = [i for i, e in enumerate(events) if e == "decode True"]
    assert len(decodes) == 4 and events.count("decode False") == 1
    for before, after in itertools.pairwise(decodes):
        assert "tick" in events[before:after], events


async def test_a_large_push_cancelled_while_it_waits_for_its_turn_is_answered_503_and_holds_nothing(
    served: tuple[Engine, Any],
) -> None:
    _engine, app = served
    data = b"x" * LARGE_BODY
    first = asyncio.create_task(call(app, "POST", "/push/raw", make_envelope(data, "m1", {"id": "k1"})))
    second = asyncio.create_task(call(app, "POST", "/push/raw", make_envelope(data, "m2", {"id": "k2"})))
    await asyncio.sleep(0)  # both bodies read: the first holds the turn, the second waits for it
    second.cancel()  # what the shutdown's cancel does to a request in flight
    status, answer = await second
    assert status == 503, answer
    status, _ = await first
    assert status == 200
    handler = app.push  # the push handler behind the app
    assert handler.in_flight.held == 0
