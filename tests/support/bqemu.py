"""Start bqemulator (a local BigQuery API on DuckDB) for the suite, and stop it after.

`bq_emulator` is a session-scoped fixture: one emulator process for the whole run, on
free ports, ready when `GET /healthz` answers. Tests isolate themselves by dataset name.
See /work/shared/notes/emulators.md ("BigQuery: bqemulator") for the pins and fixes it
needs; they are in the `test` extra.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import bigquery

from .children import dying_with_parent

PROJECT = "test-project"
START_DEADLINE = 60.0  # seconds; it is normally ready in 2-4 s
STOP_DEADLINE = 10.0


@dataclass(frozen=True)
class BqEmulator:
    host: str  # "http://127.0.0.1:PORT", the form BIGQUERY_EMULATOR_HOST wants
    project: str
    pid: int
    started_in: float  # seconds from spawn to healthy

    def client(self, project: str | None = None) -> bigquery.Client:
        return bigquery.Client(
            project=project or self.project,
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=self.host),
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def start_bqemulator(log_path: Path, project: str = PROJECT) -> tuple[subprocess.Popen[bytes], BqEmulator]:
    if importlib.util.find_spec("bqemulator") is None:
        pytest.fail(
            "bqemulator is not installed in this environment, so the BigQuery emulator tests "
            "cannot run. Install the test extra: pip install -e '.[test]'",
            pytrace=False,
        )
    rest, grpc = free_port(), free_port()
    while grpc == rest:
        grpc = free_port()
    env = dict(os.environ, BQEMU_ENABLE_FORMAT_EXTENSIONS="false")
    cmd = [
        sys.executable, "-m", "bqemulator", "start",
        "--rest-port", str(rest), "--grpc-port", str(grpc),
        "--project", project, "--log-level", "warning",
    ]  # fmt: skip
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            dying_with_parent(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    host = f"http://127.0.0.1:{rest}"
    deadline = started + START_DEADLINE
    wait = 0.02
    while True:
        if proc.poll() is not None:
            pytest.fail(
                f"bqemulator exited with code {proc.returncode} before it was ready "
                f"(is the spatial extension installed offline? see notes/emulators.md; "
                f"pip install -e '.[test]'). Its log:\n{_tail(log_path)}",
                pytrace=False,
            )
        if _healthy(f"{host}/healthz"):
            break
        if time.monotonic() > deadline:
            stop(proc)
            pytest.fail(
                f"bqemulator did not answer {host}/healthz within {START_DEADLINE:g}s. Its log:\n{_tail(log_path)}",
                pytrace=False,
            )
        time.sleep(wait)
        wait = min(wait * 1.5, 0.2)
    return proc, BqEmulator(host=host, project=project, pid=proc.pid, started_in=time.monotonic() - started)


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL if it lingers; returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_DEADLINE)
    return int(proc.returncode)


@pytest.fixture(scope="session")
def bq_emulator() -> Iterator[BqEmulator]:
    """A running bqemulator for the session; fails (never skips) when it cannot start."""
    with tempfile.TemporaryDirectory(prefix="bqemu-") as tmp:
        log_path = Path(tmp) / "bqemulator.log"
        proc, emu = start_bqemulator(log_path)
        try:
            yield emu
        finally:
            stop(proc)
            assert proc.poll() is not None, f"bqemulator (pid {proc.pid}) is still running"
