"""The embedded backends on Cloud Run: files inside an instance, lost with it and never shared.
`serve`, `pull` and `replay --through-filter` refuse to start with them where Cloud Run runs them
(K_SERVICE, CLOUD_RUN_JOB), `check --for cloud-run` refuses them from anywhere, each with the line
that fixes it; the examples meant for Cloud Run pass. Terraform's refusal: test_infra_wiring.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from structlog.testing import capture_logs

from pubsub_filter.cli import FAILED, main
from pubsub_filter.core.config.schema import parse
from pubsub_filter.runtime import durability, startup
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_EXAMPLE = ROOT / "examples" / "filter.yaml"
CLOUD_RUN_EXAMPLES = [ROOT / "examples" / "cloud-run.yaml", ROOT / "infra" / "example-config.yaml"]
ROUTE = {"name": "injuries", "destination": "phase3", "subscription": "raw-injuries", "key": ["payload.k"]}
#: the one line that fixes each embedded part
FIX = {
    "store": "Fix: `store: {backend: firestore}`",
    "publisher": "Fix: `publisher: {backend: pubsub}`",
    "records": "Fix: `records: {backend: bigquery}`",
}
CLOUD = {"store": {"backend": "firestore"}, "publisher": {"backend": "pubsub"}, "records": {"backend": "bigquery"}}
EMBEDDED = {"store": {"backend": "sqlite"}, "publisher": {"backend": "outbox"}, "records": {"backend": "sqlite"}}


@pytest.fixture(autouse=True)
def not_on_cloud_run(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*durability.CLOUD_RUN_ENVS, durability.UNSAFE_ENV):
        monkeypatch.delenv(name, raising=False)


def write(tmp_path: Path, **sections: Any) -> Path:
    path = tmp_path / "filter.yaml"
    path.write_text(yaml.safe_dump({"project": "demo", **sections, "routes": [ROUTE]}), encoding="utf-8")
    return path


def embedded_default(tmp_path: Path) -> Path:
    """No backend section at all: the embedded default, as examples/filter.yaml runs."""
    return write(tmp_path)


# --- serve and pull where Cloud Run runs them ------------------------------------------------------


@pytest.mark.parametrize(("variable", "value"), [("K_SERVICE", "pubsub-filter"), ("CLOUD_RUN_JOB", "replays")])
def test_serve_on_cloud_run_refuses_the_embedded_default_with_the_line_that_fixes_each_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str, value: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, value)
    path = embedded_default(tmp_path)
    assert main(["serve", "-c", str(path), "--host", "127.0.0.1", "--port", str(free_port())]) == FAILED
    err = capsys.readouterr().err
    assert err.startswith(f"{path}: 3 problems\n"), err
    for part, fix in FIX.items():
        [line] = [line for line in err.splitlines() if line.startswith(f"  {path}: {part}: ")]
        assert f"on Cloud Run ({variable} is set)" in line and fix in line
    assert "never reach Pub/Sub" in err  # what the outbox would have done with every forward
    assert sorted(os.listdir(tmp_path)) == ["filter.yaml"]  # refused before any file was made


def test_pull_on_cloud_run_refuses_the_embedded_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("K_SERVICE", "pubsub-filter-pull")
    path = write(tmp_path, **{**CLOUD, "store": {"backend": "sqlite", "path": str(tmp_path / "state.db")}})
    assert main(["pull", "-c", str(path)]) == FAILED
    err = capsys.readouterr().err
    assert err.startswith(f"{path}: store: backend sqlite ") and FIX["store"] in err
    assert err.count("\n") == 1, err  # one part refused, one line


def test_the_experiments_variable_set_to_anything_but_its_value_still_refuses_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("K_SERVICE", "pubsub-filter")
    monkeypatch.setenv(durability.UNSAFE_ENV, "1")
    assert main(["serve", "-c", str(embedded_default(tmp_path)), "--port", str(free_port())]) == FAILED
    err = capsys.readouterr().err
    assert f"{durability.UNSAFE_ENV}='1' is set, but only {durability.UNSAFE_VALUE!r} starts" in err


async def test_started_anyway_by_the_experiments_variable_the_loss_is_logged_at_error_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(startup, "configure", lambda **_: None)
    monkeypatch.setenv("K_SERVICE", "pubsub-filter")
    monkeypatch.setenv(durability.UNSAFE_ENV, durability.UNSAFE_VALUE)
    files = {k: {"path": str(tmp_path / f"{k}.db")} for k in ("store", "records")}
    cfg = parse(
        {
            **files,
            "publisher": {"path": str(tmp_path / "out.jsonl")},
            "telemetry": {"metrics": False, "traces": False},
            "routes": [ROUTE],
        }
    )
    assert durability.refusal(cfg, durability.detect()) == []  # what lets serve and pull start
    with capture_logs() as logs:
        engine = startup.start(cfg, auth=False, port=8080)
    try:
        events = [line["event"] for line in logs]
        assert events.index("embedded_backends_on_cloud_run") < events.index("config_loaded")
        [line] = [line for line in logs if line["event"] == "embedded_backends_on_cloud_run"]
        assert line["log_level"] == "error"
        assert line["started_anyway_by"] == durability.UNSAFE_ENV
        assert [entry.split(":")[0] for entry in line["lost"]] == ["store", "publisher", "records"]
    finally:
        await engine.close()


def test_replay_through_the_filter_on_a_cloud_run_job_refuses_the_outbox(tmp_path: Path) -> None:
    """A separate process: replay sets up the process's logging before it gets this far. Its
    dead letters would be acked once the outbox inside the job's container took them."""
    path = write(tmp_path, **{**CLOUD, "publisher": {"backend": "outbox", "path": str(tmp_path / "o.jsonl")}})
    env = {k: v for k, v in os.environ.items() if k not in (*durability.CLOUD_RUN_ENVS, durability.UNSAFE_ENV)}
    env.update(
        CLOUD_RUN_JOB="replay", PYTHONPATH=f"{ROOT / 'filter'}{os.pathsep}{ROOT}", PUBSUB_EMULATOR_HOST="127.0.0.1:1"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pubsub_filter",
            "replay",
            "dlq-sub",
            "--through-filter",
            "-c",
            str(path),
            "--project",
            "p",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == FAILED, proc.stderr
    assert proc.stderr.startswith(f"{path}: publisher: backend outbox ") and FIX["publisher"] in proc.stderr


# --- check ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("part", list(FIX))
def test_check_for_cloud_run_refuses_each_embedded_part_alone_with_its_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], part: str
) -> None:
    path = write(tmp_path, **{**CLOUD, part: {**EMBEDDED[part], "path": str(tmp_path / "file")}})
    assert main(["check", "--for", "cloud-run", str(path)]) == FAILED
    err = capsys.readouterr().err
    assert re.match(rf"{re.escape(str(path))}:\d+:1: {part}: ", err) and err.count("\n") == 1, err  # at its section
    assert "on Cloud Run (check --for cloud-run)" in err and FIX[part] in err


def test_check_for_cloud_run_refuses_the_embedded_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--for", "cloud-run", str(EMBEDDED_EXAMPLE)]) == FAILED
    err = capsys.readouterr().err
    assert all(fix in err for fix in FIX.values()), err


@pytest.mark.parametrize("example", CLOUD_RUN_EXAMPLES, ids=lambda p: p.name)
def test_the_cloud_run_examples_pass_check_for_cloud_run(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--for", "cloud-run", str(example)]) == 0
    assert capsys.readouterr().out.startswith(f"{example}: ok for Cloud Run (3 routes: ")


def test_the_cloud_run_example_has_the_embedded_examples_routes() -> None:
    """The way from one machine to Cloud Run is the backends, not new routes."""
    embedded = yaml.safe_load(EMBEDDED_EXAMPLE.read_text(encoding="utf-8"))
    cloud = yaml.safe_load(CLOUD_RUN_EXAMPLES[0].read_text(encoding="utf-8"))
    assert cloud["routes"] == embedded["routes"]
    assert {part: cloud[part]["backend"] for part in CLOUD} == {p: s["backend"] for p, s in CLOUD.items()}


def test_check_on_cloud_run_refuses_as_serve_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CLOUD_RUN_JOB", "checks")
    monkeypatch.chdir(tmp_path)
    assert main(["check", str(embedded_default(tmp_path))]) == FAILED
    assert "on Cloud Run (CLOUD_RUN_JOB is set)" in capsys.readouterr().err


def test_check_elsewhere_still_accepts_the_embedded_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["check", str(embedded_default(tmp_path))]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'filter.yaml'}: ok (1 route: injuries)\n"


def test_check_for_cloud_run_is_not_talked_round_by_the_experiments_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The variable lets a deliberate experiment start; the config is still unfit for Cloud Run."""
    monkeypatch.setenv(durability.UNSAFE_ENV, durability.UNSAFE_VALUE)
    assert main(["check", "--for", "cloud-run", str(EMBEDDED_EXAMPLE)]) == FAILED
    assert FIX["publisher"] in capsys.readouterr().err


# --- the in-process API: the same state and records, in a processor on Cloud Run ------------------


def in_process(tmp_path: Path) -> Any:
    files = {k: {"path": str(tmp_path / f"{k}.db")} for k in ("store", "records")}
    return parse({**files, "routes": [ROUTE]})


def test_the_in_process_api_on_cloud_run_refuses_embedded_state_and_records_before_it_starts_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from pubsub_filter.core.config.schema import ConfigError
    from pubsub_filter.inprocess import Filter, SyncFilter

    monkeypatch.setenv("K_SERVICE", "processor")
    threads = threading.active_count()
    for api in (Filter, SyncFilter):
        with pytest.raises(ConfigError) as refused:
            api(in_process(tmp_path))
        # no publisher: each call's body sends, so only the state and the records are the filter's
        assert [p.split(":")[0] for p in refused.value.problems] == ["store", "records"]
        assert FIX["store"] in refused.value.problems[0] and FIX["records"] in refused.value.problems[1]
    assert threading.active_count() == threads  # SyncFilter's loop thread never started
    assert sorted(os.listdir(tmp_path)) == []


async def test_the_in_process_api_started_anyway_logs_the_loss_at_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pubsub_filter.inprocess import Filter

    monkeypatch.setenv("K_SERVICE", "processor")
    monkeypatch.setenv(durability.UNSAFE_ENV, durability.UNSAFE_VALUE)
    with capture_logs() as logs:
        f = Filter(in_process(tmp_path))
    try:
        [line] = [line for line in logs if line["event"] == "embedded_backends_on_cloud_run"]
        assert line["log_level"] == "error" and [p.split(":")[0] for p in line["lost"]] == ["store", "records"]
    finally:
        await f.close()
