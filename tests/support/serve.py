"""Run `pubsub-filter serve` as a real subprocess for end-to-end and fault tests.

    proc = ServeProcess(config_path, log_path, env={"PUBSUB_EMULATOR_HOST": ...}).start()
    proc.url("/push/injury")                         # http://127.0.0.1:PORT/push/injury
    proc.wait_decisions(lambda ds: len(ds) >= 3)     # polls its JSON log lines
    proc.stop()                                      # SIGTERM; asserts a clean exit; kills on timeout

The port comes from $PORT, as on Cloud Run. Decisions are read from the process's own
structured log (one `decision` line per decision), which appears as soon as it is made;
the records SQLite file is flushed in batches and is complete after `stop()`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .net import free_port

START_DEADLINE = 30.0
STOP_DEADLINE = 20.0


def serve_executable() -> str:
    """The `pubsub-filter` console script of the interpreter running the tests."""
    candidate = Path(sys.executable).parent / "pubsub-filter"
    if candidate.exists():
        return str(candidate)
    repo = Path(__file__).resolve().parents[2]
    return str(repo / ".venv" / "bin" / "pubsub-filter")


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    return path


class ServeProcess:
    """One `pubsub-filter serve` process on a free port; its stdout+stderr go to `log_path`."""

    def __init__(
        self,
        config_path: Path,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        name: str = "serve",
        command: list[str] | None = None,
    ):
        self.config_path = Path(config_path)
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.name = name
        self.command = command or [serve_executable()]  # what runs `serve ...` (a bench's what-if wrapper)
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self._offset = 0
        self._events: list[dict[str, Any]] = []

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, deadline: float = START_DEADLINE) -> ServeProcess:
        env = dict(os.environ)
        env.update(self.extra_env)
        env["PORT"] = str(self.port)
        env.setdefault("LOG_FORMAT", "json")
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [*self.command, "serve", "--config", str(self.config_path), "--host", "127.0.0.1"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(self.config_path.parent),
                start_new_session=True,
            )
        until = time.monotonic() + deadline
        wait = 0.02
        while not self._healthy():
            code = self.proc.poll()
            if code is not None:
                self.returncode = code
                self.proc = None
                raise AssertionError(f"{self.name} exited with {code} before it was healthy:\n{self.tail()}")
            if time.monotonic() > until:
                self.kill()
                raise AssertionError(f"{self.name} did not answer /healthz within {deadline:g}s:\n{self.tail()}")
            time.sleep(wait)
            wait = min(wait * 1.5, 0.1)
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url("/healthz"), timeout=0.5) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, deadline: float = STOP_DEADLINE) -> int:
        """SIGTERM and wait; assert the process shut down cleanly. SIGKILL (and fail) on timeout."""
        proc = self.proc
        if proc is None:
            assert self.returncode is not None, f"{self.name} was never started"
            return self.returncode
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"{self.name} did not stop within {deadline:g}s of SIGTERM (killed):\n{self.tail()}"
                ) from None
        self.proc = None
        self.returncode = code = proc.returncode
        # Cloud Run stops every instance with SIGTERM: a drained shutdown must exit 0.
        assert code == 0, f"{self.name} exited with {code} after SIGTERM, expected 0:\n{self.tail()}"
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc is not None:
            self.returncode = self.proc.returncode
        self.proc = None

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.stop()
        else:
            with contextlib.suppress(AssertionError):
                self.stop()

    # --- what it says ------------------------------------------------------------------

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def events(self) -> list[dict[str, Any]]:
        """Every JSON log line so far (other lines, e.g. stdlib logging, are skipped)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return list(self._events)
        complete = chunk.rfind(b"\n") + 1
        self._offset += complete
        for line in chunk[:complete].splitlines():
            if line.startswith(b"{"):
                with contextlib.suppress(ValueError):
                    self._events.append(json.loads(line))
        return list(self._events)

    def decisions(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("message") == "decision"]

    def wait_decisions(
        self, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        """Poll the log until `done(decisions)` holds; fail with the log tail after `timeout`."""
        return wait_decisions([self], done, timeout)[self.name]


def wait_decisions(
    procs: list[ServeProcess], done: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0
) -> dict[str, list[dict[str, Any]]]:
    """Poll several processes' logs until `done(all their decisions)` holds."""
    until = time.monotonic() + timeout
    while True:
        by_proc = {p.name: p.decisions() for p in procs}
        if done([d for ds in by_proc.values() for d in ds]):
            return by_proc
        if time.monotonic() > until:
            tails = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
            raise AssertionError(f"decisions not reached within {timeout:g}s:\n{tails}")
        time.sleep(0.05)


def records(path: Path) -> list[dict[str, Any]]:
    """Every row of a records SQLite file (complete once the process has stopped)."""
    db = sqlite3.connect(str(path))
    try:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM decisions ORDER BY time")]
    finally:
        db.close()
