"""Can the files the config names be opened, are the clients of the Google backends it picks
installed (their extras), and are there credentials for them? Asked by `check` (files and
clients) and before `serve` and `pull` start (all three); `replay --through-filter` asks
for the clients (`clients`).

The embedded backends open their files lazily or deep inside start-up: a missing
directory showed up as a traceback, or (the outbox) as a 500 on the first forward.
Nothing here writes a file the service uses: an existing one is opened and closed; for
a new one, a nameless temporary file is created in its directory and removed at once,
because permissions alone do not say whether a file can be created there (root passes
them in /proc and on some read-only mounts). Relative paths are taken from the current
directory, as the service will.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path

from pubsub_filter.backends import extras
from pubsub_filter.core.config.schema import Config, ConfigError
from pubsub_filter.core.ports import Failure
from pubsub_filter.runtime.operational import BIGQUERY, FIRESTORE, PUBSUB, Backend


def problems(cfg: Config) -> list[str]:
    found = extras.missing(cfg)  # first: without its client a backend cannot start at all
    if cfg.store.backend == "sqlite":
        found += _sqlite("store.path", Path(cfg.store.path))
    if cfg.records.backend == "sqlite":
        found += _sqlite("records.path", Path(cfg.records.path))
    if cfg.publisher.backend == "outbox":
        found += _appendable("publisher.path", Path(cfg.publisher.path))
    return found


def check(cfg: Config, source: str) -> None:
    """Raise `ConfigError` naming each file that cannot be opened or created."""
    found = problems(cfg)
    if found:
        raise ConfigError(source, found)


def clients(cfg: Config, source: str) -> None:
    """Raise `ConfigError` (one line naming the install) when a backend `cfg` picks lacks its client."""
    found = extras.missing(cfg)
    if found:
        raise ConfigError(source, found)


def _creatable(key: str, path: Path) -> list[str]:
    parent = path.absolute().parent
    if not parent.exists():
        return [f"{key}: cannot create {str(path)!r}: the directory {str(parent)!r} does not exist"]
    if not parent.is_dir():
        return [f"{key}: cannot create {str(path)!r}: {str(parent)!r} is not a directory"]
    if not os.access(parent, os.W_OK | os.X_OK):
        return [f"{key}: cannot create {str(path)!r}: no permission to write in {str(parent)!r}"]
    try:
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as exc:
        return [f"{key}: cannot create {str(path)!r}: no file can be created in {str(parent)!r} ({exc.strerror})"]
    return []


def _sqlite(key: str, path: Path) -> list[str]:
    if path.is_dir():
        return [f"{key}: {str(path)!r} is a directory, not a database file"]
    # WAL keeps its -wal and -shm files beside the database: the directory must be writable either way.
    found = _creatable(key, path)
    if found or not path.exists():
        return found
    try:
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=rw", uri=True)
        try:
            db.execute("PRAGMA schema_version").fetchone()
        finally:
            db.close()
    except sqlite3.Error as exc:
        return [f"{key}: cannot open {str(path)!r} as a SQLite database: {exc}"]
    return []


def _appendable(key: str, path: Path) -> list[str]:
    if path.is_dir():
        return [f"{key}: {str(path)!r} is a directory, not a file"]
    if not path.exists():
        return _creatable(key, path)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError as exc:
        return [f"{key}: cannot append to {str(path)!r}: {exc.strerror}"]
    return []


def credentials(backends: list[Backend]) -> None:
    """Raise `Failure` naming what to set when a Google backend would have no credentials.

    Checked before any client exists: a client created without credentials fails deep in
    start-up, after google-auth has logged its own warning about the metadata server, and
    the line it leads to cannot know which emulator variable was forgotten.
    """
    needing = [b for b in backends if not os.environ.get(b.emulator_env)]
    if not needing or _found_credentials():
        return
    from pubsub_filter.google.shared import NO_CREDENTIALS_HOW

    emulators = " or ".join(f"{b.emulator_env} for the {b.name} emulator" for b in needing)
    line = f"no Google credentials: {NO_CREDENTIALS_HOW}, or set {emulators}"
    on_emulators = [b.emulator_env for b in (PUBSUB, FIRESTORE, BIGQUERY) if os.environ.get(b.emulator_env)]
    if on_emulators:  # half an emulator setup: the variable left out is the likely mistake
        line += f" ({', '.join(on_emulators)} is set, {', '.join(b.emulator_env for b in needing)} is not)"
    raise Failure(line)


def _found_credentials() -> bool:
    from google.auth.exceptions import DefaultCredentialsError

    from pubsub_filter.google.shared import quiet_default_credentials

    try:
        quiet_default_credentials()
    except DefaultCredentialsError:
        return False
    return True
