"""Suite-wide fixtures: the Pub/Sub and Firestore emulators, started lazily by the first test that asks.

A missing SDK, emulator component or java FAILS the test with what to install; it never
skips. Each emulator is one JVM we own, stopped by PID at the end of the session.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Callable, Generator, Iterator
from typing import TypeVar

import pytest

from tests.support.emulators import Emulator, EmulatorError, FirestoreEmulator, PubsubEmulator
from tests.support.loopclock import WatchedLoop
from tests.support.loopwatch import BLOCKED, limit, loop_watch, watch_coroutine_tests
from tests.support.pace import REFERENCE, measured, pace

__all__ = ["loop_watch"]  # a fixture: every coroutine test uses it (`pytest_collection_modifyitems`)

E = TypeVar("E", bound=Emulator)


def _session_emulator(emu: E) -> Iterator[E]:
    try:
        emu.start()
    except EmulatorError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield emu
    finally:
        pid = emu.pid
        emu.stop()
        assert not emu.running, f"the {emu.name} emulator (pid {pid}) is still running"


@pytest.fixture(scope="session")
def pubsub_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PubsubEmulator]:
    """The Pub/Sub emulator for the session: `.host`, `.project`, `.reset()`, `.env()`, `.stop()`/`.start()`."""
    emu = PubsubEmulator(log_dir=tmp_path_factory.mktemp("pubsub-emulator"))
    yield from _session_emulator(emu)


@pytest.fixture(scope="session")
def firestore_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirestoreEmulator]:
    """The Firestore emulator for the session; restartable on the same port (`.stop()`, `.start()`)."""
    emu = FirestoreEmulator(log_dir=tmp_path_factory.mktemp("firestore-emulator"))
    yield from _session_emulator(emu)


@pytest.fixture
def firestore(firestore_emulator: FirestoreEmulator) -> Iterator[FirestoreEmulator]:
    """The Firestore emulator, running (restarted if a previous test left it stopped) and wiped."""
    try:
        firestore_emulator.start()
        firestore_emulator.reset()
    except EmulatorError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield firestore_emulator


#: Past its pytest-timeout by this much, a test is one whose timeout was swallowed (the timeout is
#: raised in the main thread, and code under test that catches BaseException can take it).
BACKSTOP = 120


_stderr: list[int] = []


def pytest_report_header(config: pytest.Config) -> str:
    """The machine's pace, measured before the first test (`tests.support.pace`), and the loop
    watch's limit it gives."""
    here, where = measured() * 1000, REFERENCE * 1000
    return (
        f"pace: {pace():.2f} (the reference work's best round {here:.1f} ms here, {where:.0f} ms where the limits"
        f" were set); loop watch: {limit():.3f}s ({BLOCKED}s x the pace)"
    )


def pytest_configure(config: pytest.Config) -> None:
    pace()  # measured now, on a quiet thread, not inside the first watched test
    _stderr.append(os.dup(2))  # the terminal's stderr: while a test runs, fd 2 is pytest's capture


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """A test that outlives its timeout by `BACKSTOP` seconds ends the run with every thread's
    stack, rather than hold CI until its own limit with nothing said."""
    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker is not None and marker.args else float(item.config.getini("timeout"))
    if limit > 0:
        faulthandler.dump_traceback_later(limit + BACKSTOP, exit=True, file=_stderr[0])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The loop is watched in every coroutine test (`tests.support.loopwatch`)."""
    watch_coroutine_tests(items)


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], WatchedLoop]]:
    """Coroutine tests run on a loop whose clock readings say how long its thread waited for a
    CPU, so the loop watch counts only what the code held (`tests.support.loopclock`)."""
    return {"watched": WatchedLoop}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many steps the model-based engine and push tests ran (the closing note quotes it)."""
    import sys

    model = sys.modules.get("tests.support.engine_model")
    for backend, steps in sorted(getattr(model, "STEPS", {}).items()):
        terminalreporter.write_line(f"engine model: {steps} steps on {backend}")
    inprocess = sys.modules.get("tests.support.inprocess_model")
    for surface, steps in sorted(getattr(inprocess, "STEPS", {}).items()):
        terminalreporter.write_line(f"{surface} model: {steps} steps")
    push = getattr(sys.modules.get("tests.support.push_model"), "STEPS", {})
    if push:
        terminalreporter.write_line(
            f"push model: {push['push-shutdown']} push-with-shutdown steps, {push['shutdowns']} shutdowns"
        )
