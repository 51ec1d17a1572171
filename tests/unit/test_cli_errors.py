"""Operational errors end a command with one line on stderr and a documented exit code
(README "Exit codes": 1 failed, 2 usage), within seconds, never with a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pubsub_filter.cli import FAILED, USAGE, main
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: an unreachable backend must be reported well within this (the client libraries retry for 60 s)
UNREACHABLE_DEADLINE = 10.0

ROWS_CONFIG = """\
routes:
  - name: injuries
    destination: phase3
    subscription: raw-injuries
    key: [payload.game_date]
    rows: payload.players
    row_key: [player]
"""


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def rows_config(tmp_path: Path) -> Path:
    path = tmp_path / "filter.yaml"
    path.write_text(ROWS_CONFIG)
    return path


def with_backend(config: Path, section: str, backend: str) -> Path:
    path = config.with_name(f"{backend}.yaml")
    path.write_text(f"project: demo\n{section}:\n  backend: {backend}\n" + config.read_text())
    return path


@pytest.fixture
def no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Application Default Credentials anywhere google-auth looks, and no metadata server."""
    for name in list(os.environ):
        if name.startswith(("GOOGLE_", "GCLOUD_", "CLOUDSDK_")) or name.endswith("_EMULATOR_HOST"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


# --- serve ----------------------------------------------------------------------------


def test_serve_with_a_port_env_that_is_not_a_number_is_a_usage_error(
    rows_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PORT", "abc")
    assert main(["serve", "-c", str(rows_config)]) == USAGE
    assert "PORT='abc' is not a port number" in one_line(capsys.readouterr().err)


def test_serve_with_a_port_out_of_range_is_a_usage_error(rows_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "-c", str(rows_config), "--port", "70000"]) == USAGE
    assert "--port 70000 is not a port number" in one_line(capsys.readouterr().err)


def test_serve_on_a_port_in_use_fails_before_starting(
    rows_config: Path, busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "-c", str(rows_config), "--host", "127.0.0.1", "--port", str(busy_port)]) == FAILED
    captured = capsys.readouterr()
    assert f"cannot listen on 127.0.0.1:{busy_port}" in one_line(captured.err)
    assert captured.out == ""  # nothing started: no serving/stopped lines


@pytest.mark.usefixtures("no_credentials")
def test_explain_with_firestore_and_no_credentials_says_how_to_get_them(
    rows_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = with_backend(rows_config, "store", "firestore")
    payload = str(EXAMPLES / "injury-report.json")
    # with a proxy set the probe of firestore.googleapis.com stands aside (the client goes through it)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    assert main(["explain", "-c", str(config), "-r", "injuries", payload]) == FAILED
    assert "no Google credentials" in one_line(capsys.readouterr().err)


# --- fingerprint and explain inputs ---------------------------------------------------


@pytest.mark.parametrize("command", ["fingerprint", "explain"])
def test_a_missing_payload_file_is_named(
    command: str, rows_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.json"
    assert main([command, "-c", str(rows_config), "-r", "injuries", str(missing)]) == FAILED
    assert f"{missing}: No such file or directory" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", ["fingerprint", "explain"])
def test_an_attribute_without_a_value_is_a_usage_error(
    command: str, rows_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "-c", str(rows_config), "-r", "injuries", "-a", "foo", str(EXAMPLES / "injury-report.json")])
    assert exited.value.code == USAGE
    assert "'foo' is not NAME=VALUE" in one_line(capsys.readouterr().err)


def test_an_attribute_value_may_contain_equals_signs(rows_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    payload = rows_config.with_name("p.json")
    payload.write_text('{"game_date": "d1", "players": []}')
    assert main(["fingerprint", "-c", str(rows_config), "-r", "injuries", "-a", "q=a=b", "-v", str(payload)]) == 0
    assert "message fingerprint: sha256:" in capsys.readouterr().out


def test_fingerprint_of_a_payload_without_its_rows_is_rejected_in_one_line(
    rows_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = rows_config.with_name("norows.json")
    payload.write_text('{"game_date": "2026-01-01"}')
    assert main(["fingerprint", "-c", str(rows_config), "-r", "injuries", str(payload)]) == FAILED
    assert "payload rejected: payload.players is missing from the payload" in one_line(capsys.readouterr().err)


def test_check_counts_one_route_in_the_singular(rows_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(rows_config)]) == 0
    assert capsys.readouterr().out == f"{rows_config}: ok (1 route: injuries)\n"


# --- unreachable backends: a closed local port, as a separate process -------------------


def _run(
    args: list[str], env: dict[str, str], cwd: Path, credentials: bool = True
) -> tuple[subprocess.CompletedProcess[str], float]:
    full = {k: v for k, v in os.environ.items() if not k.endswith("_EMULATOR_HOST")}
    if not credentials:
        full = {k: v for k, v in full.items() if not k.startswith(("GOOGLE_", "GCLOUD_", "CLOUDSDK_"))}
    full.update(env, PYTHONPATH=f"{ROOT / 'filter'}{os.pathsep}{ROOT}", GOOGLE_CLOUD_PROJECT="demo")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pubsub_filter", *args],
        env=full,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc, time.monotonic() - started


def test_serve_with_firestore_and_no_credentials_says_how_to_get_them(rows_config: Path, tmp_path: Path) -> None:
    """A separate process: serve configures logging for the whole process before it fails."""
    config = with_backend(rows_config, "store", "firestore")
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "NO_GCE_CHECK": "True", "PORT": str(free_port())}
    proc, _ = _run(["serve", "-c", str(config), "--host", "127.0.0.1"], env, tmp_path, credentials=False)
    assert proc.returncode == FAILED, proc.stderr
    assert "no Google credentials: run `gcloud auth application-default login`" in one_line(proc.stderr)


@pytest.mark.parametrize(
    ("name", "args", "section", "backend", "variable", "form"),
    [
        (
            "explain",
            ["explain", "-r", "injuries", "payload.json"],
            "store",
            "firestore",
            "FIRESTORE_EMULATOR_HOST",
            "{}",
        ),
        ("skip-rate", ["skip-rate"], "records", "bigquery", "BIGQUERY_EMULATOR_HOST", "http://{}"),
        ("replay", ["replay", "dlq-sub"], None, None, "PUBSUB_EMULATOR_HOST", "{}"),
        ("provision", ["provision", "--pull"], None, None, "PUBSUB_EMULATOR_HOST", "{}"),
    ],
)
def test_an_unreachable_emulator_is_reported_within_seconds(
    name: str,
    args: list[str],
    section: str | None,
    backend: str | None,
    variable: str,
    form: str,
    rows_config: Path,
) -> None:
    config = with_backend(rows_config, section, backend) if section and backend else rows_config
    (rows_config.parent / "payload.json").write_text('{"game_date": "d1", "players": []}')
    address = form.format(f"127.0.0.1:{free_port()}")  # nobody listens there
    proc, took = _run([*args, "-c", str(config)], {variable: address}, rows_config.parent)
    assert took < UNREACHABLE_DEADLINE, (took, proc.stderr)
    assert proc.returncode == FAILED, proc.stderr
    line = one_line(proc.stderr)
    assert line.startswith(f"pubsub-filter {name}: ") and f"emulator at {address} ({variable}) is not reachable" in line


# --- replay finds its config as every command does -----------------------------------------


@pytest.fixture
def in_config_dir(rows_config: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding ./filter.yaml, and no $PUBSUB_FILTER_CONFIG; Pub/Sub never reached."""
    monkeypatch.chdir(rows_config.parent)
    monkeypatch.delenv("PUBSUB_FILTER_CONFIG", raising=False)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "demo")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # the probe of the API stands aside
    return rows_config


def test_replay_route_reads_the_config_in_the_working_directory(
    in_config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--route", "nope"]) == USAGE
    assert one_line(capsys.readouterr().err) == "pubsub-filter replay: --route: no route 'nope' in the config\n"


def test_replay_route_reads_the_config_named_by_the_environment(
    in_config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("PUBSUB_FILTER_CONFIG", str(in_config_dir))
    assert main(["replay", "--route", "nope"]) == USAGE
    assert "--route: no route 'nope' in the config" in one_line(capsys.readouterr().err)


def test_replay_route_without_any_config_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PUBSUB_FILTER_CONFIG", raising=False)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "demo")
    assert main(["replay", "--route", "injuries"]) == USAGE
    err = one_line(capsys.readouterr().err)
    assert err.startswith("pubsub-filter replay: --route needs a config") and "$PUBSUB_FILTER_CONFIG" in err, err


@pytest.mark.usefixtures("no_credentials")
def test_replay_without_a_project_says_so_in_its_own_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    assert main(["replay", "dlq-sub"]) == USAGE
    err = one_line(capsys.readouterr().err)
    assert err.startswith("pubsub-filter replay: no project") and "--project" in err, err


def test_serve_on_the_pubsub_emulator_without_the_firestore_one_names_the_missing_variable(
    rows_config: Path, tmp_path: Path
) -> None:
    """Before any client exists: no google-auth warning about the metadata server comes first."""
    config = with_backend(rows_config, "store", "firestore")
    env = {
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
        "NO_GCE_CHECK": "True",
        "PORT": str(free_port()),
        "PUBSUB_EMULATOR_HOST": "127.0.0.1:9",
    }
    proc, _ = _run(["serve", "-c", str(config), "--host", "127.0.0.1"], env, tmp_path, credentials=False)
    assert proc.returncode == FAILED, proc.stderr
    line = one_line(proc.stderr)
    assert "set FIRESTORE_EMULATOR_HOST for the Firestore emulator" in line, line
    assert "PUBSUB_EMULATOR_HOST is set, FIRESTORE_EMULATOR_HOST is not" in line, line
    assert proc.stdout == "", "no log line (google-auth's included) before the error"
