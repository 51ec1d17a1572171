"""`pubsub-filter explain`: the decision and its reasons, with no side effects."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.cli import main
from pubsub_filter.core.config.schema import load
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.transitions import claimed
from pubsub_filter.core.envelope import parse_envelope
from pubsub_filter.core.model import Lease, Message
from pubsub_filter.runtime.wiring import make_store
from tests.support.clock import ManualClock
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.payloads import injury_report


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    config = {
        "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
        "routes": [
            {
                "name": "injury",
                "destination": "phase3",
                "key": ["payload.game_date"],
                "rows": "payload.players",
                "row_key": ["player_lookup"],
                "include": ["player_lookup", "injury_status", "reason"],
            }
        ],
    }
    path = tmp_path / "filter.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, injury_report(50)


async def forward(path: Path, report: dict[str, Any], clock: ManualClock | None = None) -> None:
    cfg = load(path)
    engine = Engine(cfg, make_store(cfg), MemoryPublisher(), MemoryRecorder(), clock)
    await engine.handle("injury", Message(json.dumps(report).encode(), {}, "m1"))
    await engine.store.close()


def explain(path: Path, tmp_path: Path, payload: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    file = tmp_path / "payload.json"
    file.write_text(json.dumps(payload))
    assert main(["explain", "--config", str(path), "--route", "injury", "--format", "json", str(file)]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return result


def test_explain_names_the_rows_and_fields_that_changed(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    asyncio.run(forward(path, report))
    changed = copy.deepcopy(report)
    changed["players"][4]["reason"] = "Sprained ankle"
    result = explain(path, tmp_path, changed, capsys)
    assert (result["decision"], result["reason"]) == ("forwarded", "content changed")
    assert result["rows_changed"] == 1 and result["changes"] == [{"row": '["player0004"]', "fields": ["reason"]}]
    assert result["stored"]["source_message_id"] == "m1"


def test_explain_says_why_unchanged_content_is_suppressed(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    asyncio.run(forward(path, report))
    result = explain(path, tmp_path, report, capsys)
    assert (result["decision"], result["reason"]) == ("suppressed", "unchanged since last forward")


def test_explain_writes_nothing(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    asyncio.run(forward(path, report))
    before = asyncio.run(SqliteStore(tmp_path / "state.db").read("injury", "2025-01-10"))
    explain(path, tmp_path, injury_report(51), capsys)
    after = asyncio.run(SqliteStore(tmp_path / "state.db").read("injury", "2025-01-10"))
    assert before is not None and after is not None and before.version == after.version


def test_explain_decides_on_expired_state_as_the_engine_does_as_if_it_were_gone(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    # forwarded in 1970: its state expired decades ago, whether or not a TTL has deleted it yet
    asyncio.run(forward(path, report, ManualClock(start=1000.0)))
    result = explain(path, tmp_path, report, capsys)
    assert (result["decision"], result["reason"]) == ("forwarded", "new key")
    assert result["stored"]["source_message_id"] == "m1", "what is stored is still shown as it is"


def test_explain_for_a_new_key_says_so(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    result = explain(path, tmp_path, report, capsys)
    assert (result["decision"], result["stored"]) == ("forwarded", None)


def rejecting(path: Path) -> Path:
    """The setup's config, its route saying `on_missing_key: reject`."""
    config = yaml.safe_load(path.read_text())
    config["routes"][0]["on_missing_key"] = "reject"
    path.write_text(yaml.safe_dump(config))
    return path


def test_explain_says_a_payload_without_its_key_is_forwarded_without_a_dedup_decision(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    asyncio.run(forward(path, report))  # state for the key it would have had: not read
    del report["game_date"]
    result = explain(path, tmp_path, report, capsys)
    assert (result["decision"], result["key"], result["stored"]) == ("fail_open", None, None)
    assert result["missing_field"] == "payload.game_date"
    assert result["reason"] == (
        "key field payload.game_date is missing: forwarded without a dedup decision (on_missing_key: forward)"
    )


def test_explain_in_words_names_the_field_that_cannot_be_read(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = setup
    file = tmp_path / "norows.json"
    file.write_text('{"game_date": "d", "players": "none"}')
    assert main(["explain", "--config", str(path), "--route", "injury", str(file)]) == 0
    out = capsys.readouterr().out
    assert "key:          none: payload.players cannot be read" in out
    assert "decision:     fail_open: payload.players is a string, not a list of rows: forwarded without" in out
    assert "stored:       not read" in out


def test_explain_of_a_payload_without_its_key_is_a_clear_error_where_the_route_rejects_it(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rejecting(setup[0])
    file = tmp_path / "bad.json"
    file.write_text('{"players": []}')
    assert main(["explain", "--config", str(path), "--route", "injury", str(file)]) == 1
    assert "key field payload.game_date is missing" in capsys.readouterr().err


def test_explain_says_noise_only_where_the_noise_audit_would_whatever_its_sampling_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {
        "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")},
        "routes": [
            {
                "name": "injury",
                "destination": "phase3",
                "key": ["payload.game_date"],
                "rows": "payload.players",
                "row_key": ["player_lookup"],
                "include": ["player_lookup", "injury_status"],
                "audit_sample": 0.01,
            }
        ],
    }
    path = tmp_path / "filter.yaml"
    path.write_text(yaml.safe_dump(config))
    report = injury_report(5)
    asyncio.run(forward(path, report))
    noisy = copy.deepcopy(report)
    noisy["players"][0]["reason"] = "a field outside the selection"
    result = explain(path, tmp_path, noisy, capsys)
    assert (result["decision"], result["reason"]) == (
        "noise_only",
        "unchanged, but fields outside the selection changed",
    )


async def unknown_downstream(db: Path) -> None:
    """What a claim over a lapsed forward of other content (or a fail-open's) leaves once released."""
    store = SqliteStore(db)
    try:
        seen = await store.read("injury", "2025-01-10")
        assert seen is not None
        seen = seen.unknown_downstream()
        lease = Lease("other/1", seen.fence + 1, seen.forwarded_at or 0.0, "sha256:" + "9" * 64, "m2")
        held = await store.claim("injury", "2025-01-10", seen, claimed(seen, lease, seen.expires_at or 0.0))
        assert held is not None
        await store.release("injury", "2025-01-10", held)
    finally:
        await store.close()


def test_explain_says_what_the_destination_holds_is_unknown_rather_than_printing_none(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    asyncio.run(forward(path, report))
    asyncio.run(unknown_downstream(tmp_path / "state.db"))
    file = tmp_path / "payload.json"
    file.write_text(json.dumps(report))
    assert main(["explain", "--config", str(path), "--route", "injury", str(file)]) == 0
    stored = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("stored:"))
    assert "None" not in stored and "unknown" in stored


def test_explain_in_a_directory_without_state_creates_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir, inputs = tmp_path / "work", tmp_path / "inputs"
    workdir.mkdir()
    inputs.mkdir()
    config = inputs / "filter.yaml"  # no store section: the default, filter-state.db in the working directory
    config.write_text(yaml.safe_dump({"routes": [{"name": "injury", "destination": "phase3", "key": ["payload.d"]}]}))
    payload = inputs / "payload.json"
    payload.write_text('{"d": "2025-01-10"}')
    monkeypatch.chdir(workdir)
    assert main(["explain", "--config", str(config), "--route", "injury", "--format", "json", str(payload)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["decision"], result["stored"]) == ("forwarded", None)
    assert list(workdir.iterdir()) == []


def test_explain_leaves_the_state_files_bytes_as_they_were(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    asyncio.run(forward(path, report))
    before = (tmp_path / "state.db").read_bytes()
    result = explain(path, tmp_path, report, capsys)
    assert result["stored"]["source_message_id"] == "m1"
    assert (tmp_path / "state.db").read_bytes() == before


def test_explain_reads_a_state_file_an_earlier_version_wrote_without_upgrading_it(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    # the first release's layout: no row table, no rows or full_fingerprint columns
    with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as db, db:
        db.execute(
            "CREATE TABLE key_state (route TEXT NOT NULL, key TEXT NOT NULL, version INTEGER NOT NULL, "
            "fingerprint TEXT, forwarded_at REAL, message_id TEXT, publish_time REAL, recent TEXT NOT NULL "
            "DEFAULT '[]', fence INTEGER NOT NULL DEFAULT 0, lease_holder TEXT, lease_fence INTEGER, "
            "lease_expires REAL, lease_fingerprint TEXT, lease_message_id TEXT, expires_at REAL, "
            "PRIMARY KEY (route, key)) WITHOUT ROWID"
        )
        db.execute(
            "INSERT INTO key_state (route, key, version, fingerprint, forwarded_at, message_id, fence, expires_at) "
            "VALUES ('injury', '2025-01-10', 1, 'sha256:old', 1.0, 'm-old', 1, 9e9)"
        )
    before = (tmp_path / "state.db").read_bytes()
    result = explain(path, tmp_path, report, capsys)
    assert (result["stored"]["source_message_id"], result["stored"]["fingerprint"]) == ("m-old", "sha256:old")
    assert (tmp_path / "state.db").read_bytes() == before


# --- errors and inputs as a user meets them ------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_explain_of_a_payload_without_its_key_says_so_in_the_commands_own_words(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rejecting(setup[0])
    file = tmp_path / "bad.json"
    file.write_text('{"players": []}')
    assert main(["explain", "--config", str(path), "--route", "injury", str(file)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pubsub-filter explain: payload rejected: ") and err.count("\n") == 1, err


def test_explain_as_json_prints_a_rejection_as_a_json_decision(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rejecting(setup[0])
    file = tmp_path / "bad.json"
    file.write_text('{"players": []}')
    assert main(["explain", "--config", str(path), "--route", "injury", "--format", "json", str(file)]) == 1
    result = json.loads(capsys.readouterr().out)
    assert (result["route"], result["decision"]) == ("injury", "rejected")
    assert "key field payload.game_date is missing" in result["reason"]


def test_explain_of_an_unknown_route_is_a_usage_error_in_the_commands_own_words(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    file = tmp_path / "payload.json"
    file.write_text(json.dumps(report))
    assert main(["explain", "--config", str(path), "--route", "nope", str(file)]) == 2
    assert capsys.readouterr().err == "pubsub-filter explain: no route 'nope' in the config (routes: injury)\n"


@pytest.fixture
def quick_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The quick start's config, its state in a fresh directory."""
    monkeypatch.chdir(tmp_path)
    return EXAMPLES / "filter.yaml"


def test_explain_decodes_the_quick_starts_push_envelope_and_says_it_did(
    quick_start: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envelope = EXAMPLES / "push-injury.json"
    args = ["explain", "-c", str(quick_start), "-r", "injury-report", "--format", "json", str(envelope)]
    assert main(args) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert (result["decision"], result["key"]) == ("forwarded", "2025-01-10")
    assert "is a Pub/Sub push envelope" in captured.err and captured.err.count("\n") == 1, captured.err


def test_explain_of_a_redelivered_push_envelope_says_duplicate_as_the_server_would(
    quick_start: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envelope = EXAMPLES / "push-injury.json"
    cfg = load(quick_start)
    message = parse_envelope(envelope.read_bytes())
    engine = Engine(cfg, make_store(cfg), MemoryPublisher(), MemoryRecorder())

    async def forward_it() -> None:
        await engine.handle("injury-report", message)
        await engine.store.close()

    asyncio.run(forward_it())
    capsys.readouterr()  # the engine's own decision line
    args = ["explain", "-c", str(quick_start), "-r", "injury-report", "--format", "json", str(envelope)]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["decision"] == "duplicate"


def test_fingerprint_of_a_push_envelope_is_that_of_its_data(
    quick_start: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envelope = EXAMPLES / "push-injury.json"
    data = tmp_path / "data.json"
    data.write_bytes(parse_envelope(envelope.read_bytes()).data)
    assert main(["fingerprint", "-c", str(quick_start), "-r", "injury-report", str(data)]) == 0
    expected = capsys.readouterr().out
    assert main(["fingerprint", "-c", str(quick_start), "-r", "injury-report", str(envelope)]) == 0
    captured = capsys.readouterr()
    assert captured.out == expected and "is a Pub/Sub push envelope" in captured.err


def test_explain_says_a_message_is_judged_under_a_changed_selection(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    asyncio.run(forward(path, report))
    narrowed = yaml.safe_load(path.read_text())
    narrowed["routes"][0]["include"] = ["player_lookup", "injury_status"]
    path.write_text(yaml.safe_dump(narrowed))
    changed = copy.deepcopy(report)
    changed["players"][4]["reason"] = "no longer compared"
    result = explain(path, tmp_path, changed, capsys)
    assert result["decision"] == "suppressed"
    assert result["reason"] == "selection changed (include -reason): unchanged as the new selection compares it"
    assert result["selection_change"] == "narrowed"
    file = tmp_path / "payload.json"
    assert main(["explain", "--config", str(path), "--route", "injury", str(file)]) == 0
    text = capsys.readouterr().out
    assert "selection:    narrowed: the last forward was judged under selection" in text
    assert "pubsub-filter plan" in text


def test_explain_says_a_coalesced_route_holds_a_message_before_it_decides(
    setup: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, report = setup
    config = yaml.safe_load(path.read_text())
    config["routes"][0]["coalesce"] = {"quiet": "500ms", "max_wait": "2s"}
    path.write_text(yaml.safe_dump(config))
    result = explain(path, tmp_path, report, capsys)
    assert result["coalesce"] == {"quiet_s": 0.5, "max_wait_s": 2.0}
    file = tmp_path / "payload.json"
    assert main(["explain", "--config", str(path), "--route", "injury", str(file)]) == 0
    assert "coalesce:     held first" in capsys.readouterr().out
