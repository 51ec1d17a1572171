"""The files a config names: one that cannot be opened or created is reported by `check`
and stops `serve` at start with one line, instead of failing messages later."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pubsub_filter.cli import main
from tests.support.net import free_port

ROOT = Path(__file__).parents[2]
ROUTE = {"name": "r", "destination": "phase3", "key": ["payload.game_date"]}


def config(tmp_path: Path, **sections: Any) -> Path:
    defaults = {
        "store": {"path": str(tmp_path / "state.db")},
        "publisher": {"path": str(tmp_path / "outbox.jsonl")},
        "records": {"path": str(tmp_path / "decisions.db")},
    }
    path = tmp_path / "filter.yaml"
    path.write_text(yaml.safe_dump({**defaults, **sections, "routes": [ROUTE]}))
    return path


def check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["check", str(path)])
    return code, capsys.readouterr().err


def test_check_reports_a_store_in_a_directory_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, store={"path": str(tmp_path / "missing" / "state.db")})
    code, err = check(path, capsys)
    assert code == 1
    assert err == f"{path}:11:9: store.path: cannot create {str(tmp_path / 'missing' / 'state.db')!r}: " + (
        f"the directory {str(tmp_path / 'missing')!r} does not exist\n"
    )


def test_check_reports_records_at_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = check(config(tmp_path, records={"path": str(tmp_path)}), capsys)
    assert code == 1 and "records.path: " in err and "is a directory" in err


def test_check_reports_an_outbox_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "plain").write_text("")
    code, err = check(config(tmp_path, publisher={"path": str(tmp_path / "plain" / "outbox.jsonl")}), capsys)
    assert code == 1 and "publisher.path: " in err and "is not a directory" in err


def test_check_reports_an_outbox_at_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = check(config(tmp_path, publisher={"path": str(tmp_path)}), capsys)
    assert code == 1 and "publisher.path: " in err and "is a directory" in err


def test_check_reports_a_store_file_that_is_not_a_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "state.db").write_text("not sqlite " * 100)
    code, err = check(config(tmp_path), capsys)
    assert code == 1 and "store.path: cannot open" in err and "not a database" in err


def test_check_reports_every_unusable_file_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gone = tmp_path / "gone"
    path = config(
        tmp_path,
        store={"path": str(gone / "s.db")},
        records={"path": str(gone / "r.db")},
        publisher={"path": str(gone / "o.jsonl")},
    )
    code, err = check(path, capsys)
    assert code == 1 and [line.split(": ")[1] for line in err.splitlines()[1:]] == [  # in line order
        "publisher.path",
        "records.path",
        "store.path",
    ]


def test_check_accepts_usable_files_and_creates_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sqlite3.connect(tmp_path / "state.db").close()  # one that exists, two to be created
    path = config(tmp_path)
    before = sorted(os.listdir(tmp_path))
    code, _ = check(path, capsys)
    assert code == 0 and sorted(os.listdir(tmp_path)) == before


def test_serve_with_an_unusable_store_exits_1_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    path = config(tmp_path, store={"path": str(tmp_path / "missing" / "state.db")})
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'filter'}{os.pathsep}{ROOT}"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pubsub_filter",
            "serve",
            "--config",
            str(path),
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        f"{path}: store.path: cannot create {str(tmp_path / 'missing' / 'state.db')!r}: "
        f"the directory {str(tmp_path / 'missing')!r} does not exist"
    ]


# --- a directory that exists but takes no new file (/proc, a read-only mount) ---------------

NO_FILES_HERE = Path("/proc")
needs_proc = pytest.mark.skipif(not (NO_FILES_HERE / "self").exists(), reason="needs Linux's /proc")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'filter'}{os.pathsep}{ROOT}"}
    env["PUBSUB_EMULATOR_HOST"] = f"127.0.0.1:{free_port()}"
    return subprocess.run(
        [sys.executable, "-m", "pubsub_filter", *args], capture_output=True, text=True, env=env, timeout=60
    )


@needs_proc
@pytest.mark.parametrize("section", ["store", "records"])
def test_check_reports_a_directory_where_no_file_can_be_created(
    section: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # /proc passes os.access for root: only creating a file says that SQLite could not
    code, err = check(config(tmp_path, **{section: {"path": "/proc/decisions.db"}}), capsys)
    assert code == 1
    assert f"{section}.path: cannot create '/proc/decisions.db': " in err


@needs_proc
@pytest.mark.parametrize("command", ["serve", "pull"])
def test_serve_and_pull_with_records_where_no_file_can_be_created_exit_1_with_one_line(
    command: str, tmp_path: Path
) -> None:
    path = config(tmp_path, project="p", records={"path": "/proc/decisions.db"})
    raw = yaml.safe_load(path.read_text())
    raw["routes"][0]["subscription"] = "raw-reports"  # pull's need
    path.write_text(yaml.safe_dump(raw))
    listen = ["--host", "127.0.0.1", "--port", str(free_port())] if command == "serve" else []
    run = run_cli(command, "--config", str(path), *listen)
    assert run.returncode == 1
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith(f"{path}: records.path: cannot create '/proc/decisions.db': ")


@pytest.mark.parametrize(("section", "what"), [("store", "state"), ("records", "records")])
def test_an_sqlite_file_that_cannot_be_opened_at_start_is_one_line_naming_the_file(
    section: str, what: str, tmp_path: Path
) -> None:
    # what `check` cannot foresee (the file changed since): the engine's start says which file, in one line
    from pubsub_filter.core.config.schema import parse
    from pubsub_filter.core.ports import Failure
    from pubsub_filter.runtime.operational import describe
    from pubsub_filter.runtime.wiring import make_engine

    cfg = parse(yaml.safe_load(config(tmp_path, **{section: {"path": str(tmp_path)}}).read_text()))
    with pytest.raises(Failure) as exc:
        make_engine(cfg)
    assert describe(exc.value) == f"cannot open {what} file {tmp_path}: unable to open database file"
