"""The production state store: one Firestore document per (route, key), optimistic writes only.

No transactions: the Firestore emulator locks pessimistically (a 2 s wait, then `Aborted`),
and production wants the cheaper path too. Every write carries a precondition instead:

- `read`    one `get()`; the snapshot's `update_time` is the state's `version`;
- `claim`   `create()` for a new key (`AlreadyExists` → beaten), else `update()` with
            `last_update_time=seen.version` (`FailedPrecondition` → beaten);
- `extend`, `commit`, `release`: `update()` with `last_update_time=held.version`. If that
            fails, the document is read once: when the stored lease still carries held's
            fence and holder (our own write moved `update_time`, e.g. a heartbeat whose reply
            was lost), the write is retried on the new `update_time`; otherwise the lease is
            someone else's and the write is refused.

So the suppress path costs one document read and the forward path one read, one claim
and one commit (plus a heartbeat write per `lease.heartbeat` while a publish runs).
`ops` counts every RPC by kind for tests and benches. The reads and writes are the library's
`get()`, `create()` and `update()` as RPCs go, made with plain protobuf messages on the
client's channel (`firestore_wire`: about half the client CPU per call).

Document id: sha256 hex of `route + "\\x00" + key` (ids have length and character
limits); `route` and `key` are kept as fields for humans. Times are Firestore timestamps;
`expires_at` (`TTL_FIELD`) is what the TTL policy deletes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc

from pubsub_filter.backends import extras

try:  # the `firestore` extra: a bare install has no Firestore client
    from google.cloud import firestore
    from google.cloud.firestore_v1.services.firestore import async_client as gapic_client
    from google.cloud.firestore_v1.services.firestore.transports import grpc_asyncio
except ImportError as exc:
    raise extras.import_error(extras.FIRESTORE, exc) from exc

from pubsub_filter.backends.stores import TTL_FIELD
from pubsub_filter.backends.stores.firestore_wire import Wire
from pubsub_filter.core.model import KeyState, Lease
from pubsub_filter.core.ports import StoreUnavailable

T = TypeVar("T")

DEFAULT_DATABASE = "(default)"
DEFAULT_COLLECTION = "pubsub-filter"
PING_DOCUMENT = "_ping"

#: Outcomes of a precondition: the write lost a race; not an outage.
_LOST = (gexc.AlreadyExists, gexc.FailedPrecondition, gexc.NotFound)
#: Everything else the client can raise means the store did not answer usefully: the
#: route's `on_store_error` decides (fail open by default, loudly).
_UNAVAILABLE = (
    gexc.GoogleAPIError,
    auth_exc.TransportError,
    auth_exc.RefreshError,
    grpc.RpcError,
    grpc.aio.UsageError,  # a call on a closed channel
    TimeoutError,
    ConnectionError,
)


def doc_id(route: str, key: str) -> str:
    """The document id for (route, key): fixed length, any characters in the key."""
    return hashlib.sha256(f"{route}\x00{key}".encode()).hexdigest()


def _ts(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC)


def _secs(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value)


def to_document(route: str, key: str, s: KeyState) -> dict[str, Any]:
    le = s.lease
    return {
        "route": route,
        "key": key,
        "fingerprint": s.fingerprint,
        "forwarded_at": _ts(s.forwarded_at),
        "message_id": s.message_id,
        "publish_time": _ts(s.publish_time),
        "recent": [{"id": mid, "fp": fp} for mid, fp in s.recent],
        "fence": s.fence,
        "lease": (
            {
                "holder": le.holder,
                "fence": le.fence,
                "expires_at": _ts(le.expires_at),
                "fingerprint": le.fingerprint,
                "message_id": le.message_id,
            }
            if le is not None
            else None
        ),
        TTL_FIELD: _ts(s.expires_at),
        "rows": s.rows,  # bytes: one opaque blob, so per-row digests cost no index entries
        "full_fingerprint": s.full_fingerprint,
        # the in-process API's kept results: a field earlier versions do not read
        "results": [{"id": mid, "fp": fp, "r": r} for mid, fp, r in s.results],
        # what the route compared (`pubsub_filter.core.compare.selection`): absent in documents written before
        # it was stored, read as the route's selection; earlier versions ignore it
        "selection": s.selection,
    }


#: `KeyState` attribute → document field, for every field `to_document` writes but route and key.
_FIELDS = (
    ("fingerprint", "fingerprint"),
    ("forwarded_at", "forwarded_at"),
    ("message_id", "message_id"),
    ("publish_time", "publish_time"),
    ("recent", "recent"),
    ("fence", "fence"),
    ("lease", "lease"),
    ("expires_at", TTL_FIELD),
    ("rows", "rows"),
    ("full_fingerprint", "full_fingerprint"),
    ("results", "results"),
    ("selection", "selection"),
)


def changes(route: str, key: str, stored: KeyState, new: KeyState) -> dict[str, Any]:
    """The fields to update for the document holding `stored` to hold `new` (a commit).

    A commit writes under a precondition on `stored`'s lease, so a field equal in both is
    already stored and is left out: above all the row state (~54 KB at 450 rows). A blank
    value (None, no recent ids) is written all the same.
    """
    doc = to_document(route, key, new)
    out = {}
    for attr, name in _FIELDS:
        value = getattr(new, attr)
        if value is None or value == () or value != getattr(stored, attr):
            out[name] = doc[name]
    return out


def claim_changes(route: str, key: str, seen: KeyState, new: KeyState) -> dict[str, Any]:
    """The fields a claim updates: all of `new`'s, but row state equal to `seen`'s.

    The precondition is on the version `seen` was read at, but `seen` is the state the decision
    judged, which the engine may have changed from what it read: expired state forgotten
    (`KeyState.forgotten`), a fail-open's content and newer publish time (`FailedOpen.view`).
    Only the row state is never changed but blanked, so only it can be left out as stored.
    """
    doc = to_document(route, key, new)
    return {name: doc[name] for _, name in _FIELDS if name != "rows" or new.rows is None or new.rows != seen.rows}


def from_document(data: Mapping[str, Any], version: Any) -> KeyState:
    raw = data.get("lease")
    lease = (
        Lease(
            holder=raw["holder"],
            fence=int(raw["fence"]),
            expires_at=_secs(raw["expires_at"]) or 0.0,
            fingerprint=raw["fingerprint"],
            message_id=raw["message_id"],
        )
        if raw
        else None
    )
    return KeyState(
        fingerprint=data.get("fingerprint"),
        forwarded_at=_secs(data.get("forwarded_at")),
        message_id=data.get("message_id"),
        publish_time=_secs(data.get("publish_time")),
        recent=tuple((r["id"], r["fp"]) for r in data.get("recent") or ()),
        fence=int(data.get("fence") or 0),
        lease=lease,
        expires_at=_secs(data.get(TTL_FIELD)),
        rows=data.get("rows"),
        full_fingerprint=data.get("full_fingerprint"),
        results=tuple((r["id"], r["fp"], r["r"]) for r in data.get("results") or ()),
        version=version,
        selection=data.get("selection"),
    )


def _ours(current: KeyState | None, lease: Lease) -> bool:
    return (
        current is not None
        and current.lease is not None
        and current.lease.fence == lease.fence
        and current.lease.holder == lease.holder
    )


#: gRPC waits out a growing backoff (1 s, 1.6 s, 2.6 s, ... up to 120 s) before it dials a
#: failed address again, so after an outage or a partition a default channel can keep
#: failing for minutes after Firestore is back. Retry the connection at least every second.
RECONNECT_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class _ReconnectingTransport(grpc_asyncio.FirestoreGrpcAsyncIOTransport):
    @classmethod
    def create_channel(cls, *args: Any, **kwargs: Any) -> Any:
        kwargs["options"] = [*(kwargs.get("options") or ()), *RECONNECT_OPTIONS]
        return super().create_channel(*args, **kwargs)


class ReconnectingClient(firestore.AsyncClient):
    """`AsyncClient` whose gRPC channel (to Firestore or to the emulator) has `RECONNECT_OPTIONS`.

    Hooks the two places google-cloud-firestore 2.x builds its channel; everything else
    (project, database, credentials, `FIRESTORE_EMULATOR_HOST`) is the library's own.
    """

    @property
    def _firestore_api(self) -> Any:
        return self._firestore_api_helper(_ReconnectingTransport, gapic_client.FirestoreAsyncClient, gapic_client)

    def channel(self) -> grpc.aio.Channel:
        """The client's gRPC channel (built on first use), for calls made with plain protobuf messages."""
        return self._firestore_api.transport.grpc_channel

    @property
    def emulated(self) -> bool:
        """Talking to the emulator (`FIRESTORE_EMULATOR_HOST` was set when the client was made)."""
        return self._emulator_host is not None

    def _emulator_channel(self, transport: Any) -> Any:
        token = getattr(self._credentials, "id_token", None) or "owner"
        options = [
            ("Authorization", f"Bearer {token}"),  # as the library sends it
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1),
            *RECONNECT_OPTIONS,
        ]
        return grpc.aio.insecure_channel(self._emulator_host, options=options)


class FirestoreCollection:
    """One Firestore collection we read and write with preconditions: the filter's state
    store, and the consumer's fences (`consumer.stores.firestore`) alike.

    `timeout` bounds each RPC; the client's own retries are off (callers retry within
    their own budget). The channel redials a lost connection at least every second
    (`RECONNECT_OPTIONS`), so a backend that comes back is used again at once.
    """

    default_collection = DEFAULT_COLLECTION

    def __init__(
        self,
        project: str | None = None,
        database: str | None = None,
        collection: str | None = None,
        *,
        timeout: float = 10.0,
    ):
        self.project = project or os.environ.get("GOOGLE_CLOUD_PROJECT")
        self.database = database or DEFAULT_DATABASE
        self.collection = collection or self.default_collection
        self.timeout = timeout
        self.ops: Counter[str] = Counter()  # RPCs made, by kind (benches and tests read it)
        self._client: Any = ReconnectingClient(project=self.project, database=self.database)
        self._wire: Wire | None = None  # made on the first call: the client builds its channel then

    @property
    def wire(self) -> Wire:
        """The store's RPCs as plain protobuf calls on the client's channel (`firestore_wire`)."""
        if self._wire is None:
            database = f"projects/{self._client.project}/databases/{self.database}"
            self._wire = Wire(self._client.channel(), database, self._client.emulated, self.timeout)
        return self._wire

    async def close(self) -> None:
        self._wire = None  # its channel closes now: a later call builds both again, as the client does
        await close_client(self._client)


class FirestoreStore(FirestoreCollection):
    """`StateStore` on Firestore (`FIRESTORE_EMULATOR_HOST` is honoured by the client).
    `GuardedStore` retries its calls within the route's budget."""

    @property
    def client(self) -> Any:
        """The `google.cloud.firestore.AsyncClient`."""
        return self._client

    def document(self, route: str, key: str) -> Any:
        """The `AsyncDocumentReference` holding (route, key)."""
        return self._client.collection(self.collection).document(doc_id(route, key))

    def _name(self, document: str) -> str:
        return f"{self.wire.database}/documents/{self.collection}/{document}"

    # --- plumbing ---------------------------------------------------------------------

    async def _rpc(self, kind: str, call: Awaitable[T]) -> T:
        self.ops[kind] += 1
        try:
            return await call
        except _LOST:
            self.ops["conflict"] += 1
            raise
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"firestore {kind}: {type(exc).__name__}: {exc}") from exc

    async def _get(self, route: str, key: str) -> KeyState | None:
        found = await self._rpc("read", self.wire.get(self._name(doc_id(route, key))))
        return None if found is None else from_document(*found)

    async def _update(self, kind: str, route: str, key: str, fields: dict[str, Any], version: Any) -> Any:
        """One conditional update; the new `update_time`. Raises a `_LOST` error if the document moved."""
        self.ops["write"] += 1
        return await self._rpc(kind, self.wire.update(self._name(doc_id(route, key)), fields, version))

    async def _fenced(
        self, kind: str, route: str, key: str, held: KeyState, fields: Callable[[KeyState], dict[str, Any]]
    ) -> tuple[Any, KeyState | None, KeyState | None]:
        """Write `fields(base)` while the stored lease is still `held`'s.

        Returns (update_time, base, None) on success, `base` being the state the write was
        applied to (held, or the re-read state when our own earlier write had moved it);
        (None, None, current) when the lease is no longer ours (`current` is what is stored).
        """
        assert held.lease is not None, f"{kind} needs the state returned by claim (with its lease)"
        base: KeyState = held
        version = held.version
        for attempt in range(2):
            if version is not None:
                try:
                    return await self._update(kind, route, key, fields(base), version), base, None
                except _LOST:
                    pass
            current = await self._get(route, key)
            if attempt == 1 or not _ours(current, held.lease):
                return None, None, current
            assert current is not None
            base, version = current, current.version
        raise AssertionError("unreachable")  # pragma: no cover

    # --- StateStore -------------------------------------------------------------------

    async def read(self, route: str, key: str) -> KeyState | None:
        return await self._get(route, key)

    async def claim(self, route: str, key: str, seen: KeyState | None, new: KeyState) -> KeyState | None:
        try:
            if seen is None:
                self.ops["write"] += 1
                data = to_document(route, key, new)
                created = await self._rpc("claim", self.wire.create(self._name(doc_id(route, key)), data))
                return replace(new, version=created)
            if seen.version is None:  # not a state this store returned: nothing to compare with
                return None
            fields = claim_changes(route, key, seen, new)
            return replace(new, version=await self._update("claim", route, key, fields, seen.version))
        except _LOST:
            return None

    async def extend(self, route: str, key: str, held: KeyState, expires_at: float) -> KeyState | None:
        update_time, base, _ = await self._fenced(
            "extend", route, key, held, lambda _: {"lease.expires_at": _ts(expires_at)}
        )
        if update_time is None or base is None or base.lease is None:
            return None
        return replace(base, lease=replace(base.lease, expires_at=expires_at), version=update_time)

    async def commit(self, route: str, key: str, held: KeyState, new: KeyState) -> bool:
        update_time, _, current = await self._fenced(
            "commit", route, key, held, lambda base: changes(route, key, base, new)
        )
        if update_time is not None:
            return True
        return current is not None and current.holds_commit_of(new)

    async def release(self, route: str, key: str, held: KeyState) -> None:
        await self._fenced("release", route, key, held, lambda _: {"lease": None})

    async def ping(self) -> None:
        """One cheap read of a sentinel document (it need not exist)."""
        await self._rpc("ping", self.wire.get(self._name(PING_DOCUMENT)))


async def close_client(client: Any) -> None:
    """Close an `AsyncClient`'s channel, if its first call ever built one.

    The client has no public way to close its gRPC channel (its `close()`, in 2.34, closes only
    an HTTP session it does not use for Firestore's calls); left open, the channel's threads and
    sockets outlive the store. So the channel the client built lazily is read, and forgotten,
    through its one private attribute (allowed, with this reason, by test_no_private_library_access).
    """
    api = getattr(client, "_firestore_api_internal", None)  # built lazily by the first call
    if api is not None:
        client._firestore_api_internal = None
        with contextlib.suppress(Exception):
            await api.transport.close()
