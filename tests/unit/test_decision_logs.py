"""`decision_logs`: quieting the lines of some decisions keeps every decision recorded and counted.

The engine runs on real parts (SQLite store behind the guard, the push app over ASGI, the
product's telemetry with its Prometheus reader); the publisher and recorder are our in-memory
ones. Lines are the JSON lines `logsetup` writes, read back from its stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
import yaml
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client.parser import text_string_to_metric_families

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.cli import main
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.config.sections import Quieting
from pubsub_filter.core.engine.decision_line import in_sample, level_of
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.google.shared import PROJECT_ENVS
from pubsub_filter.observability import logsetup
from pubsub_filter.observability.instrumented import InstrumentedPublisher, InstrumentedStore
from pubsub_filter.observability.telemetry import PrometheusText, Telemetry
from pubsub_filter.push.app import create_app
from pubsub_filter.runtime.wiring import make_engine
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.payloads import injury_report

ROUTE: dict[str, Any] = {
    "name": "reports",
    "destination": "phase3",
    "key": ["payload.game_date"],
    "subscription": "raw-reports",
}
SUB = "projects/p/subscriptions/raw-reports"


def config(**decision_logs: Any) -> Config:
    return parse({"decision_logs": decision_logs, "routes": [ROUTE]})


def lines_at(level: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    for name in ("LOG_FORMAT", "LOG_LEVEL", "K_SERVICE", *PROJECT_ENVS):
        monkeypatch.delenv(name, raising=False)
    saved, stream = structlog.get_config(), logsetup._OUT.stream
    out = io.StringIO()
    logsetup.configure(level=level, fmt="json", project="p", stream=out, cache=False)
    yield out
    structlog.configure(**saved)
    logsetup._OUT.stream = stream


@pytest.fixture
def log_lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    yield from lines_at("info", monkeypatch)


@pytest.fixture
def debug_lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    yield from lines_at("debug", monkeypatch)


def decision_lines(out: io.StringIO) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in out.getvalue().splitlines()]
    return [p for p in parsed if p.get("message") == "decision"]


class Rig:
    """The push app over one engine whose telemetry counts decisions on `/metrics`."""

    def __init__(self, tmp_path: Path, cfg: Config) -> None:
        self.prometheus = PrometheusText()
        self.telemetry = Telemetry(MeterProvider(metric_readers=[self.prometheus.reader]), None, self.prometheus)
        store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors, inline=True)
        self.recorder = MemoryRecorder()
        self.engine = Engine(
            cfg,
            InstrumentedStore(store, self.telemetry),
            InstrumentedPublisher(MemoryPublisher(), self.telemetry),
            self.recorder,
            telemetry=self.telemetry,
        )
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(self.engine)), base_url="http://f")

    async def push(self, message_id: str, game_date: str = "2025-01-10") -> str:
        body = make_envelope(json.dumps({"game_date": game_date}).encode(), message_id, subscription=SUB)
        resp = await self.client.post("/push/reports", content=body)
        assert resp.status_code == 200, resp.text
        # The store runs inline (nothing here yields to the loop): each push a step of its own, as a
        # server's requests are, not one step for a test's every push.
        await asyncio.sleep(0)
        return self.recorder.records[-1].decision

    async def counted(self) -> Counter[str]:
        resp = await self.client.get("/metrics")
        families = {f.name: f for f in text_string_to_metric_families(resp.text)}
        return Counter(
            {
                s.labels["decision"]: int(s.value)
                for s in families["pubsub_filter_decisions"].samples
                if s.name == "pubsub_filter_decisions_total"
            }
        )

    async def close(self) -> None:
        await self.client.aclose()
        await self.engine.store.close()


@pytest.fixture
async def rigs(tmp_path: Path) -> AsyncIterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for r in made:
        await r.close()


def build(rigs: list[Rig], tmp_path: Path, cfg: Config) -> Rig:
    where = tmp_path / str(len(rigs))
    where.mkdir()
    rigs.append(Rig(where, cfg))
    return rigs[-1]


# --- the setting ---------------------------------------------------------------------------


def test_by_default_no_decision_line_is_quieted() -> None:
    assert parse({"routes": [ROUTE]}).decision_logs.quieting() == {}


def test_the_setting_names_each_quieted_decision_with_its_level_and_share() -> None:
    cfg = config(suppressed={"level": "debug"}, duplicate={"sample": 0.01}, forwarded=None)
    assert cfg.decision_logs.quieting() == {
        "suppressed": Quieting("debug", 1.0),
        "duplicate": Quieting(None, 0.01),
    }


def test_check_accepts_decision_logs_and_refuses_a_decision_the_alerts_follow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(json.dumps({"decision_logs": {"suppressed": {"sample": 0.05}}, "routes": [ROUTE]}))
    assert main(["check", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"decision_logs": {"contended": {"level": "debug"}}, "routes": [ROUTE]}))
    assert main(["check", str(bad)]) == 1
    assert "decision_logs: the lines of contended cannot be quieted" in capsys.readouterr().err


# --- which lines are written ----------------------------------------------------------------


async def test_suppressions_at_debug_write_no_line_and_are_still_recorded_and_counted(
    rigs: list[Rig], tmp_path: Path, log_lines: io.StringIO
) -> None:
    rig = build(rigs, tmp_path, config(suppressed={"level": "debug"}))
    decided = [await rig.push("1")] + [await rig.push(str(i)) for i in range(2, 7)] + [await rig.push("1")]
    assert decided == ["forwarded", *["suppressed"] * 5, "duplicate"]
    assert [line["decision"] for line in decision_lines(log_lines)] == ["forwarded", "duplicate"]
    assert [r.message_id for r in rig.recorder.records] == ["1", "2", "3", "4", "5", "6", "1"]
    assert await rig.counted() == Counter({"forwarded": 1, "suppressed": 5, "duplicate": 1})


async def test_a_lowered_line_is_written_at_debug_when_the_log_level_lets_it(
    rigs: list[Rig], tmp_path: Path, debug_lines: io.StringIO
) -> None:
    rig = build(rigs, tmp_path, config(suppressed={"level": "debug"}))
    await rig.push("1")
    await rig.push("2")
    severities = {line["decision"]: line["severity"] for line in decision_lines(debug_lines)}
    assert severities == {"forwarded": "INFO", "suppressed": "DEBUG"}


async def test_a_sampled_decision_logs_exactly_the_messages_its_sample_draws(
    rigs: list[Rig], tmp_path: Path, log_lines: io.StringIO
) -> None:
    rig = build(rigs, tmp_path, config(suppressed={"sample": 0.5}))
    await rig.push("0")
    ids = [f"1700000000{i:04d}" for i in range(40)]
    for mid in ids:
        assert await rig.push(mid) == "suppressed"
    logged = [line["message_id"] for line in decision_lines(log_lines) if line["decision"] == "suppressed"]
    assert logged == [mid for mid in ids if in_sample(mid, 0.5)]
    assert 0 < len(logged) < len(ids)
    assert len(rig.recorder.records) == 41
    assert (await rig.counted())["suppressed"] == 40


@pytest.mark.loop_may_block("it builds two engines (SQLite files, meter providers) on the loop before its first await")
async def test_a_redelivery_is_logged_or_not_as_its_first_delivery_was_on_any_instance(
    rigs: list[Rig], tmp_path: Path, log_lines: io.StringIO
) -> None:
    # A redelivery of a suppressed message is answered `duplicate`: sampled alike, by the same id.
    quieted = {"suppressed": {"sample": 0.3}, "duplicate": {"sample": 0.3}}
    first, second = build(rigs, tmp_path, config(**quieted)), build(rigs, tmp_path, config(**quieted))
    ids = [str(1000 + i) for i in range(30)]
    for rig in (first, second):
        await rig.push("0")
        for mid in ids:
            await rig.push(mid)
            await rig.push(mid)
    by_id = Counter(line["message_id"] for line in decision_lines(log_lines) if line["message_id"] != "0")
    assert set(by_id.values()) == {4}  # two deliveries on each of two instances: all logged, or none
    assert set(by_id) == {mid for mid in ids if in_sample(mid, 0.3)}
    assert sum(len(r.recorder.records) for r in rigs) == 2 * (1 + 2 * len(ids))


async def test_make_engine_quiets_what_the_config_says_and_a_plain_config_quiets_nothing(tmp_path: Path) -> None:
    def embedded(**decision_logs: Any) -> Config:
        files = {k: {"path": str(tmp_path / f"{k}.db")} for k in ("store", "records")}
        publisher = {"path": str(tmp_path / "out.jsonl")}
        return parse({**files, "publisher": publisher, "decision_logs": decision_logs, "routes": [ROUTE]})

    for cfg, expected in ((embedded(stale={"level": "info"}), {"stale": Quieting("info", 1.0)}), (embedded(), {})):
        engine = make_engine(cfg)
        try:
            assert engine.quieting == expected
        finally:
            await engine.close()


async def test_two_engines_in_one_process_each_quiet_only_their_own_lines(
    rigs: list[Rig], tmp_path: Path, log_lines: io.StringIO
) -> None:
    """A library user may open two filters with different configs: neither changes the other's lines."""
    quiet = build(rigs, tmp_path, config(suppressed={"level": "debug"}))
    loud = build(rigs, tmp_path, config())
    for rig in (quiet, loud):
        assert [await rig.push("1"), await rig.push("2")] == ["forwarded", "suppressed"]
    decisions = [line["decision"] for line in decision_lines(log_lines)]
    assert decisions == ["forwarded", "forwarded", "suppressed"]


# --- the sample itself -------------------------------------------------------------------------


def test_the_sample_is_a_stable_hash_of_the_message_id() -> None:
    # blake2b, 8 bytes, big-endian, against the share of 2**64: the same in every process and version
    mid = "12345678901234"
    drawn = int.from_bytes(hashlib.blake2b(mid.encode(), digest_size=8).digest(), "big")
    assert in_sample(mid, drawn / 2**64 + 1e-9)
    assert not in_sample(mid, drawn / 2**64 - 1e-9)


def test_the_sample_keeps_about_its_share_of_pubsub_like_ids() -> None:
    ids = [str(13_000_000_000_000_000 + i) for i in range(20_000)]
    for share in (0.01, 0.1, 0.5):
        kept = sum(in_sample(mid, share) for mid in ids) / len(ids)
        assert abs(kept - share) < max(0.2 * share, 0.004), (share, kept)
    assert not any(in_sample(mid, 0.0) for mid in ids[:1000])
    assert all(in_sample(mid, 1.0) for mid in ids[:1000])


def test_a_line_outside_the_sample_is_at_debug_and_inside_at_its_level() -> None:
    inside = next(str(i) for i in range(1000) if in_sample(str(i), 0.5))
    outside = next(str(i) for i in range(1000) if not in_sample(str(i), 0.5))
    assert level_of(Quieting(None, 0.5), "info", inside) == "info"
    assert level_of(Quieting("warning", 0.5), "info", inside) == "warning"
    assert level_of(Quieting(None, 0.5), "info", outside) == "debug"
    assert level_of(Quieting("debug"), "warning", inside) == "debug"


# --- what a line costs -------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


async def test_the_line_sizes_the_cost_model_uses_are_the_lines_the_product_writes(
    tmp_path: Path, log_lines: io.StringIO
) -> None:
    """The example config's injury report on Cloud Run (its trace header on every push), rendered by
    the JSON chain: within a few bytes of the sizes docs/performance.md prices."""
    documented = re.search(
        r"a `suppressed` line is\s+(\d+) bytes, a `forwarded` one (\d+)",
        (ROOT / "docs" / "performance.md").read_text(encoding="utf-8"),
    )
    assert documented, "docs/performance.md no longer states the line sizes"
    example = yaml.safe_load((ROOT / "infra" / "example-config.yaml").read_text(encoding="utf-8"))
    files = {k: {"path": str(tmp_path / f"{k}.db")} for k in ("store", "records")}
    cfg = parse({**files, "publisher": {"path": str(tmp_path / "out.jsonl")}, "routes": example["routes"]})
    logsetup.configure(fmt="json", project=example["project"], stream=log_lines, cache=False)
    engine = make_engine(cfg)
    sub = f"projects/{example['project']}/subscriptions/pubsub-filter-injury-report"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(engine)), base_url="http://f") as c:
        for seed, mid in ((1, "13356294717040412"), (2, "13356294717040413")):  # a rescrape: same rows
            body = make_envelope(json.dumps(injury_report(40, seed)).encode(), mid, subscription=sub)
            trace = {"X-Cloud-Trace-Context": f"4bf92f3577b34da6a3ce929d0e0e47{seed:02d}/1234567890123456789;o=0"}
            assert (await c.post("/push/injury-report", content=body, headers=trace)).status_code == 200
    await engine.close()
    sizes = {
        json.loads(line)["decision"]: len(line.encode()) + 1  # the newline is stored too
        for line in log_lines.getvalue().splitlines()
        if json.loads(line).get("message") == "decision"
    }
    assert set(sizes) == {"forwarded", "suppressed"}
    assert abs(sizes["suppressed"] - int(documented[1])) <= 8, sizes
    assert abs(sizes["forwarded"] - int(documented[2])) <= 8, sizes
