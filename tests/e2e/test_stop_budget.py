"""`pubsub-filter serve` stopped as Cloud Run stops it: SIGTERM, and SIGKILL 10 s later.

With the default config and publishes that hang (every byte to Pub/Sub held for an hour), the
process must exit 0 before 10 s; every decision it answered must have its record (the SQLite
table, or the BigQuery table whose rows were still batched at the signal); nothing may be acked
that did not reach the destination; and each forward still publishing must be answered with a
nack (5xx), not cut off. Before, uvicorn alone waited `shutdown_grace` (10 s) and the engine's
close waited again after it: the process was still running when SIGKILL came.

Real time is used only to measure the exit; every wait is on what the process logged.
"""

from __future__ import annotations

import concurrent.futures
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.cloud import bigquery

from pubsub_filter.core.envelope import make_envelope
from tests.support.bqemu import BqEmulator, bq_emulator
from tests.support.emulators import PubsubEmulator
from tests.support.pubsub_helpers import DelayProxy, PubsubAdmin, unique
from tests.support.serve import ServeProcess, write_config

__all__ = ["bq_emulator"]  # a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROUTE = "stop"
#: Cloud Run's SIGKILL, after SIGTERM.
SIGKILL_AFTER = 10.0
HANGING = 4  # forwards publishing when SIGTERM comes


def envelope(message_id: str, key: int) -> bytes:
    return make_envelope(json.dumps({"k": key}).encode(), message_id)


class Served:
    def __init__(self, emu: PubsubEmulator, tmp_path: Path):
        self.admin = PubsubAdmin(emu)
        self.emu = emu
        self.tmp_path = tmp_path
        self.dest = self.admin.topic("dest")
        self.dest_sub = self.admin.pull_subscription(self.dest, "downstream")
        self.proxy = DelayProxy(emu.host).start()
        self.proc: ServeProcess | None = None

    def start(self, records: dict[str, Any], env: dict[str, str]) -> ServeProcess:
        config = {  # no `server` section: the defaults are what is tried
            "project": self.emu.project,
            "store": {"backend": "sqlite", "path": str(self.tmp_path / "state.db")},
            "publisher": {"backend": "pubsub"},
            "records": records,
            "routes": [{"name": ROUTE, "destination": self.dest, "key": ["payload.k"]}],
        }
        path = write_config(self.tmp_path / "filter.yaml", config)
        env = {"PUBSUB_EMULATOR_HOST": self.proxy.host, "GOOGLE_CLOUD_PROJECT": self.emu.project, **env}
        self.proc = ServeProcess(path, self.tmp_path / "serve.log", env={"LOG_LEVEL": "debug", **env})
        return self.proc.start()

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
        self.proxy.stop()
        self.admin.cleanup()


@pytest.fixture
def served(pubsub_emulator: PubsubEmulator, tmp_path: Path) -> Iterator[Served]:
    with closing(Served(pubsub_emulator, tmp_path)) as s:
        yield s


def post(proc: ServeProcess, body: bytes) -> httpx.Response | Exception:
    try:
        return httpx.post(proc.url(f"/push/{ROUTE}"), content=body, timeout=60.0)
    except httpx.HTTPError as exc:  # cut off: no answer at all
        return exc


def sigterm_with_publishes_hanging(served: Served, proc: ServeProcess) -> tuple[dict[str, Any], float]:
    """Answered before: a forward, its duplicate, a rejection. Then every publish hangs,
    `HANGING` forwards start, and SIGTERM comes. What each request got, and the exit's time."""
    answers: dict[str, Any] = {}
    answers["m1"] = post(proc, envelope("m1", 1))
    answers["m1 again"] = post(proc, envelope("m1", 1))
    answers["bad"] = post(proc, b'{"message": {"messageId": "bad", "data": "not base64!"}}')  # recorded with its id
    served.proxy.delay = 3600.0  # from here every publish hangs
    with concurrent.futures.ThreadPoolExecutor(HANGING) as pool:
        hanging = {f"m{i}": pool.submit(post, proc, envelope(f"m{i}", i)) for i in range(2, 2 + HANGING)}
        proc.wait_decisions(lambda _: len([e for e in proc.events() if e.get("message") == "lease_acquired"]) > HANGING)
        started = time.monotonic()
        proc.stop(deadline=SIGKILL_AFTER)  # SIGTERM; SIGKILL (and a failure) at 10 s
        took = time.monotonic() - started
        answers.update({mid: future.result() for mid, future in hanging.items()})
    return answers, took


def answered(answers: dict[str, Any]) -> list[tuple[str, str]]:
    """(message id, decision) of each answer: its id is the request's (the first word of its name)."""
    out = []
    for name, resp in answers.items():
        assert isinstance(resp, httpx.Response), f"a request was cut off, not answered: {resp!r}"
        out.append((name.split()[0], resp.json()["decision"]))
    return sorted(out)


def assert_the_contract(served: Served, answers: dict[str, Any], took: float, records: list[tuple[str, str]]) -> None:
    assert took < SIGKILL_AFTER, f"stopped {took:.1f}s after SIGTERM"
    for mid in (f"m{i}" for i in range(2, 2 + HANGING)):
        resp = answers[mid]
        assert isinstance(resp, httpx.Response), f"{mid} was cut off: {resp!r}"
        assert resp.status_code >= 500 and resp.json()["decision"] == "failed", (mid, resp.status_code, resp.text)
    assert sorted(records) == answered(answers)  # every answered decision recorded, and nothing else
    served.proxy.stop()  # nothing held back can land from here
    acked = {r.json()["message_id"] for r in answers.values() if r.status_code < 300}
    downstream = served.admin.drain(served.dest_sub, 2.0)
    assert acked == {"m1"} and {m.attributes["filter_source_message_id"] for m in downstream} == acked


def test_a_sigterm_with_publishes_hanging_exits_0_inside_cloud_runs_10_seconds_with_every_answer_recorded(
    served: Served,
) -> None:
    proc = served.start({"backend": "sqlite", "path": str(served.tmp_path / "decisions.db")}, {})
    answers, took = sigterm_with_publishes_hanging(served, proc)
    db = sqlite3.connect(str(served.tmp_path / "decisions.db"))
    try:
        records = list(db.execute("SELECT message_id, decision FROM decisions"))
    finally:
        db.close()
    assert_the_contract(served, answers, took, records)


def test_a_sigterm_with_publishes_hanging_writes_the_batched_bigquery_rows_inside_cloud_runs_10_seconds(
    served: Served, bq_emulator: BqEmulator
) -> None:
    dataset = unique("stop").replace("-", "_")
    # the rows wait up to flush_interval (5 s by default) in the batch: at the signal, they all still do
    records = {"backend": "bigquery", "project": bq_emulator.project, "dataset": dataset}
    proc = served.start(records, {"BIGQUERY_EMULATOR_HOST": bq_emulator.host})
    answers, took = sigterm_with_publishes_hanging(served, proc)
    client: bigquery.Client = bq_emulator.client()
    try:
        rows = client.query(f"SELECT message_id, decision FROM `{bq_emulator.project}.{dataset}.decisions`").result()
        found = [(row["message_id"], row["decision"]) for row in rows]
    finally:
        client.close()
    assert_the_contract(served, answers, took, found)
