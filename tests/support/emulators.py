"""Start and stop the Google Cloud SDK's Pub/Sub and Firestore emulators for tests and benches.

The JVMs are started directly (not through `gcloud ... emulators start`, which leaves its
java child running when the wrapper dies), so each emulator is exactly one PID we own:
127.0.0.1, a free port, ready when `GET http://127.0.0.1:P/` answers 200, stopped with
SIGTERM (SIGKILL after a timeout). See /work/shared/notes/emulators.md.

    emu = FirestoreEmulator(log_dir=Path("/tmp/x"))
    emu.start()                  # raises EmulatorMissing / EmulatorFailed
    with emu.env():              # FIRESTORE_EMULATOR_HOST=127.0.0.1:P
        ...
    emu.reset()                  # wipe every document of emu.project
    emu.stop(); emu.start()      # restart on the same port (fault tests)
    emu.stop()

Nothing here imports pytest: the fixtures in tests/conftest.py turn the errors into
test failures, and bench/store.py prints them.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from .children import dying_with_parent
from .net import free_port, free_ports

PROJECT = "pubsub-filter-test"
START_DEADLINE = 60.0  # seconds; normally ready in 1-2.5 s, more on a loaded 2-core box
STOP_TIMEOUT = 10.0  # SIGTERM stops them in ~0.4 s
JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Duser.language=en")

INSTALL_HINT = (
    "Install the Google Cloud SDK with its emulators and a Java 17 runtime, e.g. "
    "`apt-get install google-cloud-cli google-cloud-cli-pubsub-emulator "
    "google-cloud-cli-firestore-emulator openjdk-17-jre-headless`."
)


class EmulatorError(RuntimeError):
    """An emulator could not be started, reset or stopped."""


class EmulatorMissing(EmulatorError):
    """The SDK, the emulator component or java is not installed: says what to install."""


class EmulatorFailed(EmulatorError):
    """The emulator is installed but did not start, answer or stop as it should."""


@functools.cache
def sdk_root() -> Path:
    """The Cloud SDK root (`gcloud info --format='value(installation.sdk_root)'`)."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise EmulatorMissing(f"`gcloud` is not on PATH, so the emulators cannot be found. {INSTALL_HINT}")
    try:
        out = subprocess.run(
            [gcloud, "info", "--format=value(installation.sdk_root)"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError) as exc:
        raise EmulatorMissing(f"`gcloud info` failed ({exc}). {INSTALL_HINT}") from exc
    if not out or not Path(out).is_dir():
        raise EmulatorMissing(f"`gcloud info` gave no usable SDK root ({out!r}). {INSTALL_HINT}")
    return Path(out)


def java() -> str:
    exe = shutil.which("java")
    if exe is None:
        raise EmulatorMissing(f"`java` is not on PATH; the emulators need a Java 17 runtime. {INSTALL_HINT}")
    return exe


def _get_ok(url: str, timeout: float = 0.5) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class Emulator:
    """One emulator JVM on one port; restartable on the same port."""

    name: ClassVar[str]
    env_var: ClassVar[str]
    component: ClassVar[str]  # the apt package that provides it

    def __init__(
        self,
        project: str = PROJECT,
        port: int | None = None,
        log_dir: Path | None = None,
        start_deadline: float = START_DEADLINE,
        stop_timeout: float = STOP_TIMEOUT,
    ):
        self.project = project
        self.port = port or free_port()
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix=f"{self.name}-emulator-"))
        self.start_deadline = start_deadline
        self.stop_timeout = stop_timeout
        self.started_in: float | None = None  # seconds from spawn to ready, last start
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None

    # --- what it is -----------------------------------------------------------------

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}-emulator.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        raise NotImplementedError

    def _jar(self, pattern: str) -> str:
        matches = sorted(glob.glob(str(sdk_root() / "platform" / pattern)))
        if not matches:
            raise EmulatorMissing(
                f"the {self.name} emulator is not installed (no {pattern} under {sdk_root()}/platform). "
                f"Install `{self.component}`. {INSTALL_HINT}"
            )
        return matches[-1]

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the JVM and wait until it answers; raises EmulatorMissing / EmulatorFailed."""
        if self.running:
            return
        cmd = self.command()  # resolves the SDK, jar and java first: EmulatorMissing
        if _get_ok(self.url + "/", timeout=0.2):
            raise EmulatorFailed(f"something already answers on {self.url}: not starting the {self.name} emulator")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts + 1}: {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                dying_with_parent(cmd),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.starts += 1
        deadline = started + self.start_deadline
        wait = 0.02
        while True:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                raise EmulatorFailed(
                    f"the {self.name} emulator exited with code {code} before it was ready "
                    f"(port {self.port}). Its log ({self.log_path}):\n{_tail(self.log_path)}"
                )
            if _get_ok(self.url + "/"):
                break
            if time.monotonic() > deadline:
                self.stop()
                raise EmulatorFailed(
                    f"the {self.name} emulator did not answer GET {self.url}/ within {self.start_deadline:g}s. "
                    f"Its log ({self.log_path}):\n{_tail(self.log_path)}"
                )
            time.sleep(wait)
            wait = min(wait * 1.5, 0.1)
        self.started_in = time.monotonic() - started

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after `stop_timeout`; returns the exit code (None if it was not running).

        Raises EmulatorFailed if the process is somehow still alive afterwards.
        """
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=self.stop_timeout)
        if proc.poll() is None:
            raise EmulatorFailed(f"the {self.name} emulator (pid {proc.pid}) is still running after SIGKILL")
        self._proc = None
        return proc.returncode

    def restart(self) -> None:
        self.stop()
        self.start()

    def reset(self) -> None:
        raise NotImplementedError

    def _request(self, method: str, path: str) -> None:
        req = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                if resp.status != 200:
                    raise EmulatorFailed(f"{method} {self.url}{path} answered {resp.status}")
        except (urllib.error.URLError, OSError) as exc:
            raise EmulatorFailed(f"{method} {self.url}{path} failed: {exc}") from exc

    @contextlib.contextmanager
    def env(self) -> Iterator[None]:
        """Point the Google client libraries at this emulator for the duration of the block."""
        saved = {k: os.environ.get(k) for k in (self.env_var, "GOOGLE_CLOUD_PROJECT")}
        os.environ[self.env_var] = self.host
        os.environ.setdefault("GOOGLE_CLOUD_PROJECT", self.project)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def __enter__(self) -> Emulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.host} pid={self.pid} project={self.project}>"


class PubsubEmulator(Emulator):
    name = "pubsub"
    env_var = "PUBSUB_EMULATOR_HOST"
    component = "google-cloud-cli-pubsub-emulator"

    def command(self) -> list[str]:
        jar = self._jar("pubsub-emulator/lib/cloud-pubsub-emulator-*-all.jar")
        return [java(), *JVM_FLAGS, "-jar", jar, "--host=127.0.0.1", f"--port={self.port}"]

    def reset(self) -> None:
        """Wipe every topic and subscription (`POST /reset`)."""
        self._request("POST", "/reset")


class FirestoreEmulator(Emulator):
    name = "firestore"
    env_var = "FIRESTORE_EMULATOR_HOST"
    component = "google-cloud-cli-firestore-emulator"

    def __init__(
        self,
        project: str = PROJECT,
        port: int | None = None,
        log_dir: Path | None = None,
        start_deadline: float = START_DEADLINE,
        stop_timeout: float = STOP_TIMEOUT,
        websocket_port: int | None = None,
    ):
        if port is None and websocket_port is None:
            port, websocket_port = free_ports(2)
        super().__init__(project, port, log_dir, start_deadline, stop_timeout)
        self.websocket_port = websocket_port or free_port()

    def command(self) -> list[str]:
        jar = self._jar("cloud-firestore-emulator/cloud-firestore-emulator.jar")
        return [
            java(), *JVM_FLAGS, "-cp", jar, "com.google.cloud.datastore.emulator.firestore.CloudFirestore",
            "--host=127.0.0.1", f"--port={self.port}", f"--websocket_port={self.websocket_port}",
        ]  # fmt: skip

    def reset(self, database: str = "(default)") -> None:
        """Delete every document of this project's database."""
        self._request("DELETE", f"/emulator/v1/projects/{self.project}/databases/{database}/documents")
