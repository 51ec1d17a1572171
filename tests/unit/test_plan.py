"""`pubsub-filter plan`: what a config deploy changes in each route's comparison, how many keys it
would forward on their next message under each `new_fields` policy, an exit code to gate on, and
nothing written."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pubsub_filter.cli import main
from pubsub_filter.core.config.schema import load
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Message
from pubsub_filter.runtime.wiring import make_recorder, make_store
from tests.support.fakes import MemoryPublisher

ROUTE = {"name": "scores", "destination": "out", "key": ["payload.k"], "exclude": ["scraped_at"]}


def write(tmp_path: Path, name: str, **route: Any) -> Path:
    cfg = {
        "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
        "records": {"backend": "sqlite", "path": str(tmp_path / "records.db")},
        "publisher": {"backend": "outbox", "path": str(tmp_path / "outbox.jsonl")},
        "routes": [{**ROUTE, **route}],
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


async def forward_three(path: Path) -> None:
    cfg = load(path)
    engine = Engine(cfg, make_store(cfg), MemoryPublisher(), make_recorder(cfg))
    for k in "abc":
        body = {"k": k, "v": 1, "note": "n", "scraped_at": 1}
        await engine.handle("scores", Message(json.dumps(body).encode(), {}, f"m-{k}"))
    await engine.close()


@pytest.fixture
def deployed(tmp_path: Path) -> Path:
    old = write(tmp_path, "old.yaml")
    asyncio.run(forward_three(old))
    return old


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["plan", *args])
    return code, capsys.readouterr().out


def test_a_narrowing_forwards_nothing_and_exits_0(
    deployed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = write(tmp_path, "new.yaml", exclude=["scraped_at", "note"])
    code, out = plan(capsys, "--config", str(new), "--from", str(deployed))
    assert code == 0, out
    assert out.splitlines()[0] == "route scores: narrowed (exclude +note)"
    assert "  keys: 3 (from the decision records)" in out
    assert "forwarded on their next message: new_fields forward 0, adopt 0" in out
    assert out.splitlines()[-1] == "plan: nothing would forward that did not change"


def test_a_widening_names_the_new_fields_and_exits_2_unless_adopted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write(tmp_path, "old.yaml", exclude=["scraped_at", "note"])
    asyncio.run(forward_three(old))
    new = write(tmp_path, "new.yaml")
    code, out = plan(capsys, "--config", str(new), "--from", str(old))
    assert code == 2, out
    assert "route scores: widened (exclude -note)" in out and "  newly compared: note" in out
    assert "new_fields forward 3, adopt 0 (the route says forward)" in out
    adopted = write(tmp_path, "adopt.yaml", new_fields="adopt")
    code, out = plan(capsys, "--config", str(adopted), "--from", str(old))
    assert code == 0, out


def test_without_from_the_state_says_what_each_key_was_compared_under(
    deployed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = write(tmp_path, "new.yaml", key=["payload.id"])
    code, out = plan(capsys, "--config", str(new), "--format", "json")
    assert code == 2
    [route] = json.loads(out)
    assert (route["change"], route["keys"], route["keys_from"], route["forwards"]) == ("key changed", 3, "state", 3)
    assert "a new keyspace, not a selection change" in route["notes"][0]


def test_plan_writes_nothing(deployed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    new = write(tmp_path, "new.yaml", exclude=["scraped_at", "note"])
    plan(capsys, "--config", str(new), "--from", str(deployed))
    plan(capsys, "--config", str(new))
    assert {p: p.stat().st_mtime_ns for p in files} == files
    assert {p.name for p in tmp_path.iterdir()} - {p.name for p in files} <= {
        "new.yaml",
        "state.db-wal",
        "state.db-shm",
    }


def test_check_points_to_plan_when_the_state_was_stored_under_another_selection(
    deployed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(deployed)]) == 0
    assert "another selection" not in capsys.readouterr().out
    new = write(tmp_path, "new.yaml", exclude=["scraped_at", "note"])
    assert main(["check", str(new)]) == 0
    assert (
        "route scores: 3 keys were stored under another selection (narrowed): see what their next messages "
        f"forward with pubsub-filter plan --config {new}"
    ) in capsys.readouterr().out


def test_keys_stored_before_selections_are_counted_as_forwarding_when_the_selection_changes(
    deployed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("UPDATE key_state SET selection = NULL WHERE key = 'a'")  # as an earlier version wrote it
    db.commit()
    db.close()
    new = write(tmp_path, "new.yaml", exclude=["scraped_at", "note"])
    code, out = plan(capsys, "--config", str(new), "--from", str(deployed))
    assert code == 2, out
    assert "new_fields forward 1, adopt 1" in out
    assert "1 keys were stored before selections were" in out


def test_without_from_a_firestore_state_is_not_guessed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = {"store": {"backend": "firestore", "collection": "s"}, "project": "p", "routes": [ROUTE]}
    path = tmp_path / "fs.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["plan", "--config", str(path)]) == 1
    assert "give --from OLD" in capsys.readouterr().err
