"""The push app of one engine on the embedded store, served in process to an httpx client,
with or without push authentication: the set-up the push tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.push.app import create_app
from pubsub_filter.push.auth import PushAuthenticator
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.oidc import LocalGoogleCerts

#: The audience and the push service account the authenticated push tests sign tokens for.
AUDIENCE = "https://filter.example.run.app"
PUSHER = "pusher@p.iam.gserviceaccount.com"


def engine_on_sqlite(tmp_path: Path, config: Mapping[str, Any]) -> Engine:
    """An engine on a SQLite state file in `tmp_path`, publishing and recording in memory."""
    cfg = parse(dict(config))
    store = GuardedStore(SqliteStore(tmp_path / "state.db"), cfg.store_errors)
    return Engine(cfg, store, MemoryPublisher(), MemoryRecorder())


def authenticator(certs: LocalGoogleCerts) -> PushAuthenticator:
    """Push authentication that takes the tokens `certs` signs for `AUDIENCE` and `PUSHER`."""
    return PushAuthenticator(audience=AUDIENCE, service_account=PUSHER, certs_url=certs.url)


@asynccontextmanager
async def push_client(engine: Engine, auth: PushAuthenticator | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `engine`'s push app; `client.engine` is the engine."""
    transport = httpx.ASGITransport(app=create_app(engine, auth))
    async with httpx.AsyncClient(transport=transport, base_url="http://filter") as client:
        client.engine = engine  # type: ignore[attr-defined]
        yield client
