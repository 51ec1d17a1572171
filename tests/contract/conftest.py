"""The contract suite runs every test once per StateStore backend.

`sqlite` uses a file under tmp_path; `firestore` the Firestore emulator (started by the
first test that needs it, wiped before each test; marked `emulator`). `open_store()`
opens one more store on the same backing state — another "process" — and every store
opened is closed at teardown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.backends.stores.firestore import FirestoreStore
from pubsub_filter.backends.stores.sqlite import SqliteStore

BACKENDS = ["sqlite", pytest.param("firestore", marks=pytest.mark.emulator)]
COLLECTION = "contract"

OpenStore = Callable[[], Any]  # returns SqliteStore | FirestoreStore


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def open_store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    opened: list[Any] = []
    emu = request.getfixturevalue("firestore") if backend == "firestore" else None

    def open_() -> Any:
        store: Any
        if emu is None:
            store = SqliteStore(tmp_path / "state.db")
        else:
            with emu.env():  # the client reads FIRESTORE_EMULATOR_HOST when it is built
                store = FirestoreStore(project=emu.project, collection=COLLECTION)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        await store.close()


@pytest.fixture
def store(open_store: OpenStore) -> Any:
    return open_store()
