"""The decision, in one place: for one message on one route, forward it, suppress it, or say why not.

Read top to bottom:

1. **extract** the entity key and the payload fingerprint (`RouteRules`);
2. **look** at the stored state for (route, key): one read, no write;
3. **decide** with `judge()`, a pure function of (message, fingerprint, state, now);
4. **act**: a forward claims a fenced lease (one conditional write), publishes while a
   heartbeat keeps the lease, then commits the new fingerprint if the fence still holds
   (one conditional write); everything else acks or retries without writing;
5. **record** the decision (one log line, one row, off the request path).

The engine knows nothing of HTTP, Firestore or Pub/Sub: it talks to the interfaces in
`ports`. Push, pull and replay are thin surfaces that call `Engine.handle`; the in-process
API (`inprocess`) passes it the caller's work as `act`, run in place of the publish.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import structlog

from . import rows
from .config import Condition, Config, Route
from .envelope import format_time
from .fingerprint import NOT_JSON, PayloadError, Scheme, TypedRows, compile_scheme, message_fingerprint
from .heartbeat import Heartbeat
from .logsetup import log_line
from .model import Decision, DecisionRecord, KeyState, Lease, Message
from .paths import MISSING, list_index
from .ports import Clock, DecisionRecorder, Publisher, PublishFailed, StateStore, StoreUnavailable
from .telemetry import NO_TELEMETRY, Telemetry

log = structlog.get_logger("pubsub_filter.engine")

#: How many recently forwarded message ids each key remembers, to answer redeliveries.
RECENT = 20
#: How often a lost compare-and-set on the claim is retried before answering `contended`.
CLAIM_ATTEMPTS = 3

ATTR_FINGERPRINT = "filter_fingerprint"
ATTR_SOURCE_ID = "filter_source_message_id"
ATTR_ROUTE = "filter_route"
ATTR_SOURCE_PUBLISH_TIME = "filter_source_publish_time"
ATTR_FENCE = "filter_fence"
ATTR_KEY = "filter_key"
ATTR_KEY_SHA256 = "filter_key_sha256"
ATTRIBUTE_LIMIT = 1024
#: Attributes only the filter writes on what it forwards. A producer's own values for them are
#: dropped, so a consumer can trust them (`filter_rows_changed: 0` on a whole payload, say).
OWN_ATTRIBUTES = frozenset(
    {
        ATTR_FINGERPRINT,
        ATTR_SOURCE_ID,
        ATTR_ROUTE,
        ATTR_SOURCE_PUBLISH_TIME,
        ATTR_FENCE,
        ATTR_KEY,
        ATTR_KEY_SHA256,
        "filter_rows_total",
        "filter_rows_changed",
        "filter_rows_removed",
        "filter_rows_removed_keys",
        "filter_rows_removed_truncated",
    }
)

#: The caller's own work in place of the publish (the in-process API): it gets what a forward
#: would publish (data and attributes) and returns what the record shows as `published_id`.
Act = Callable[[bytes, Mapping[str, str]], Awaitable[str]]
# One per `handle` call, so every step that publishes (leased, shadow, fail-open) sees it
# without each signature carrying it.
_ACT: contextvars.ContextVar[Act | None] = contextvars.ContextVar("filter_act", default=None)


class WorkFailed(PublishFailed):
    """The caller's work (in place of the publish) raised: the lease is released, the message nacked."""


def fence_attributes(key: str, fence: int) -> dict[str, str]:
    """What a fenced forward carries so a consumer can drop an older holder's late copy (`filter.fence`).

    A key longer than an attribute value may be (1,024 bytes) goes as its SHA-256 under its own
    name, so no short key can be mistaken for a long key's digest.
    """
    attributes = {ATTR_FENCE: str(fence)}
    if len(key.encode()) <= ATTRIBUTE_LIMIT:
        attributes[ATTR_KEY] = key
    else:
        attributes[ATTR_KEY_SHA256] = hashlib.sha256(key.encode()).hexdigest()
    return attributes


class SystemClock:
    def now(self) -> float:
        return time.time()


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    reason: str


@dataclass(slots=True)
class Outgoing:
    """What a forward publishes (the data, possibly only the changed rows) and then commits."""

    data: bytes
    attributes: dict[str, str]
    rows: bytes | None = None
    full_fingerprint: str | None = None


# --- 1. extract -------------------------------------------------------------------


class RouteRules:
    """A route compiled once: how to key, fingerprint and bypass its messages."""

    def __init__(self, route: Route):
        self.route = route
        self.scheme: Scheme = compile_scheme(route)
        # the same content with nothing left out: what the noise audit compares
        self.full_scheme: Scheme | None = (
            compile_scheme(route.model_copy(update={"include": [], "exclude": [], "scheme": "canonical"}))
            if route.audit_sample > 0
            else None
        )
        self.tracks_rows = route.rows is not None and bool(route.row_key) and route.scheme == "canonical"

    def typed_rows(self, data: bytes) -> TypedRows | None:
        """The rows as the fingerprint's fast path decodes them (included fields only), if it vouches for them."""
        if not self.tracks_rows or self.scheme.typed_rows is None:
            return None
        return self.scheme.typed_rows(data)

    def row_digests(
        self, data: bytes, before: rows.RowDigests | None = None, typed: TypedRows | None = None
    ) -> rows.RowDigests | None:
        """Per-row digests of the whole document (the scheme's fast path may not have decoded all of it)."""
        if not self.tracks_rows or self.route.rows is None:
            return None
        typed = typed or self.typed_rows(data)
        if typed is not None:
            digests = rows.digest_typed(typed, before)
            if digests is not None:
                return digests
        payload = self.scheme.decode(data)
        if payload is NOT_JSON:
            return None
        found = self.route.rows.resolve(payload, {})
        return rows.digest_rows(self.route, found, before) if isinstance(found, list) else None

    def partial(self, data: bytes, diff: rows.RowDiff, typed: TypedRows | None = None) -> tuple[bytes, dict[str, str]]:
        """The payload with only new and changed rows (plus tombstones when asked), and attributes saying so."""
        assert self.route.rows is not None
        wanted = set(diff.added) | set(diff.changed)
        keys = tuple(self.route.row_key)
        payload, parent, leaf, kept = self._kept_raw(data, wanted, typed) or self._kept(data, wanted, keys)
        attributes = {
            "filter_rows_total": str(diff.total),
            "filter_rows_changed": str(len(wanted)),
            "filter_rows_removed": str(len(diff.removed)),
        }
        if self.route.removed_rows == "tombstone":
            kept += [
                {**dict(zip(keys, msgspec.json.decode(k), strict=False)), "filter_removed": True} for k in diff.removed
            ]
        elif self.route.removed_rows == "attribute" and diff.removed:
            listed = msgspec.json.encode(diff.removed).decode()
            if len(listed.encode()) > ATTRIBUTE_LIMIT:  # Pub/Sub caps attribute values at 1024 bytes
                attributes["filter_rows_removed_truncated"] = "true"
                listed = listed.encode()[:ATTRIBUTE_LIMIT].decode("utf-8", "ignore")
            attributes["filter_rows_removed_keys"] = listed
        if leaf:
            parent[leaf] = kept
        else:
            payload = kept
        return msgspec.json.encode(payload), attributes

    def _kept(self, data: bytes, wanted: set[str], keys: tuple[str, ...]) -> tuple[Any, Any, str | None, list[Any]]:
        """The rows to send, chosen by their keys as the digests read them (canonical numbers:
        a key spelled `1.0` is the row `[1]`), sent as the producer spelled them (plain decode)."""
        assert self.route.rows is not None
        payload = msgspec.json.decode(data)
        canonical = self.scheme.decode(data)
        parent, leaf = _parent(payload, self.route.rows.parts)
        found = parent[leaf] if leaf else payload
        as_read = self.route.rows.resolve(canonical, {})  # the same list, row for row
        if not isinstance(as_read, list) or len(as_read) != len(found):
            as_read = found  # not canonical JSON (a number it refuses): key by the plain reading
        kept = [
            r for r, c in zip(found, as_read, strict=True) if isinstance(r, dict) and rows.row_key_of(c, keys) in wanted
        ]
        return payload, parent, leaf, kept

    def _kept_raw(
        self, data: bytes, wanted: set[str], typed: TypedRows | None
    ) -> tuple[Any, Any, str | None, list[Any]] | None:
        """`_kept` without decoding the rows that are not sent: rows stay raw JSON until chosen
        by the keys of the rows the fingerprint's fast path decoded (same rows, same order);
        the chosen ones and the other top-level fields are decoded as `_kept` decodes them."""
        assert self.route.rows is not None
        typed = typed or self.typed_rows(data)
        if typed is None or len(self.route.rows.parts) != 1:
            return None
        leaf = self.route.rows.parts[0]
        try:
            top = _raw_object(data)
            found = _raw_list(top[leaf])
        except (msgspec.DecodeError, KeyError):
            return None
        if len(found) != len(typed.rows):
            return None
        payload = {k: None if k == leaf else msgspec.json.decode(v) for k, v in top.items()}  # document order
        kept = [
            msgspec.json.decode(raw)
            for raw, row in zip(found, typed.rows, strict=True)
            if typed.key_json(row).decode() in wanted
        ]
        return payload, payload, leaf, kept

    def key_of(self, payload: Any, attributes: Mapping[str, str]) -> str:
        parts = []
        for path in self.route.key:
            if path.root == "payload" and payload is NOT_JSON:
                raise PayloadError(f"key field {path} needs a JSON payload, and this payload is not JSON")
            value = path.resolve(payload, attributes)
            if value is MISSING or value is None:
                raise PayloadError(f"key field {path} is missing")
            if isinstance(value, (dict, list)):
                raise PayloadError(f"key field {path} is an object or list, not a value")
            parts.append(str(value).replace("\\", "\\\\").replace("|", "\\|"))
        return "|".join(parts)

    def bypassed(self, payload: Any, attributes: Mapping[str, str]) -> bool:
        return any(_holds(c, payload, attributes) for c in self.route.bypass)

    def accepts_subscription(self, subscription: str | None) -> bool:
        expected = self.route.subscription
        if not expected or not subscription:
            return True
        if "/" in expected:
            return subscription == expected
        return subscription.rsplit("/", 1)[-1] == expected


_raw_object = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_raw_list = msgspec.json.Decoder(list[msgspec.Raw]).decode


def _parent(payload: Any, parts: tuple[str, ...]) -> tuple[Any, str | None]:
    """The object holding the rows list, and the rows' field name in it (None: the payload is the list)."""
    if not parts:
        return payload, None
    node = payload
    for part in parts[:-1]:
        # `rows` resolved on this payload already, so every step through a list is an index
        index = list_index(part) if isinstance(node, list) else None
        node = node[part] if index is None else node[index]
    return node, parts[-1]


def _holds(cond: Condition, payload: Any, attributes: Mapping[str, str]) -> bool:
    value = (
        MISSING if (cond.field.root == "payload" and payload is NOT_JSON) else cond.field.resolve(payload, attributes)
    )
    if cond.exists is not None:
        return (value is not MISSING) == cond.exists
    if value is MISSING:
        return False
    if cond.one_of is not None:
        return value in cond.one_of
    return bool(value == cond.equals)


# --- 3. decide ----------------------------------------------------------------------


def judge(
    route: Route, msg: Message, fingerprint: str, state: KeyState | None, now: float, bypass: bool = False
) -> Verdict:
    """The decision table. Pure: the same inputs always give the same verdict."""
    if state is None:
        return Verdict(Decision.FORWARDED, "new key")
    if state.decided(msg.message_id) is not None:
        return Verdict(Decision.DUPLICATE, "message already forwarded")
    lease = state.lease
    if lease is not None and lease.live(now):
        if lease.message_id == msg.message_id:
            # Acking a redelivery acks the message itself: if the in-flight publish then
            # failed, the content would be lost. Ask again after it settles.
            return Verdict(Decision.CONTENDED, "this message is already in flight")
        if lease.fingerprint == fingerprint:
            return Verdict(Decision.DUPLICATE, "same content in flight")
        return Verdict(Decision.CONTENDED, "other content for this key is in flight")
    if bypass:
        return Verdict(Decision.FORWARDED, "bypass rule")
    if lease is not None and lease.fingerprint != state.fingerprint and state.fingerprint == fingerprint:
        # A holder's lease lapsed mid-forward (it died, or its commit never landed): its publish
        # may have reached the destination, which then no longer holds what the state says.
        return Verdict(Decision.FORWARDED, "a lapsed forward of other content may be downstream")
    if state.fingerprint == fingerprint:
        if route.window is None or state.forwarded_at is None or now - state.forwarded_at < route.window:
            return Verdict(Decision.SUPPRESSED, "unchanged since last forward")
        if not _older(msg, state):
            return Verdict(Decision.FORWARDED, "unchanged, but the window expired")
    elif state.fingerprint is None:
        return Verdict(Decision.FORWARDED, "new key")
    if _older(msg, state) and route.stale == "suppress":
        return Verdict(Decision.STALE, "published before the last forwarded message")
    return Verdict(Decision.FORWARDED, "content changed")


def look_closer(
    rules: RouteRules,
    msg: Message,
    fp: str,
    state: KeyState | None,
    verdict: Verdict,
    rng: random.Random,
) -> tuple[Verdict, Outgoing, dict[str, Any]]:
    """Refine a verdict with row-level detail and the noise audit; say what a forward would send.

    Returns the final verdict, what to publish and commit, and details for the record
    (which rows and fields changed). Only forwards, and sampled suppressions, pay for
    this: the common suppress path does not get here with any work to do.
    """
    out = Outgoing(msg.data, {})
    details: dict[str, Any] = {}
    route = rules.route
    if verdict.decision is Decision.SUPPRESSED:
        if (
            rules.full_scheme is not None
            and state is not None
            and state.full_fingerprint is not None
            and rng.random() < route.audit_sample
            and rules.full_scheme(msg.data)[1] != state.full_fingerprint
        ):
            verdict = Verdict(Decision.NOISE_ONLY, "unchanged, but fields outside the selection changed")
        return verdict, out, details
    if verdict.decision is not Decision.FORWARDED:
        return verdict, out, details
    if rules.full_scheme is not None:
        out.full_fingerprint = rules.full_scheme(msg.data)[1]
    before = rows.decode(state.rows) if state is not None and rules.tracks_rows else None
    typed = rules.typed_rows(msg.data)  # decoded once (usually kept from the fingerprint) for both uses
    digests = rules.row_digests(msg.data, before, typed)
    if digests is None:
        return verdict, out, details
    out.rows = rows.encode(digests)
    if out.rows is None:
        details["rows_state"] = "too large to keep"
    if before is None:
        return verdict, out, details
    diff = rows.diff(before, digests)
    details.update(diff.summary())
    content_changed = state is not None and state.fingerprint not in (None, fp)
    if route.rows_mode == "changed" and content_changed:
        if diff.any:
            out.data, out.attributes = rules.partial(msg.data, diff, typed)
        else:
            # The fingerprint says the content changed and no row digest does (rows that are
            # not objects, say): forward it whole. Row mode only ever narrows what a forward
            # carries; it never turns a change into a suppression.
            details["rows_forwarded"] = "whole payload: the change is outside the row digests"
    return verdict, out, details


def _older(msg: Message, state: KeyState) -> bool:
    return msg.publish_time is not None and state.publish_time is not None and (msg.publish_time < state.publish_time)


# --- the engine ---------------------------------------------------------------------


class Engine:
    def __init__(
        self,
        config: Config,
        store: StateStore,
        publisher: Publisher,
        recorder: DecisionRecorder,
        clock: Clock | None = None,
        instance: str | None = None,
        telemetry: Telemetry | None = None,
    ):
        self.config = config
        self.store = store
        self.publisher = publisher
        self.recorder = recorder
        self.clock = clock or SystemClock()
        self.instance = instance or uuid.uuid4().hex[:12]
        self.rules = {r.name: RouteRules(r) for r in config.routes}
        self.random = random.Random()
        self.in_flight = 0
        self.telemetry = telemetry or NO_TELEMETRY  # telemetry: metrics and the decision's span

    async def handle(
        self, route_name: str, msg: Message, trace: str | None = None, act: Act | None = None
    ) -> DecisionRecord:
        """Decide `msg` and act on it: publish, or with `act`, run the caller's work in its place."""
        token = _ACT.set(act)
        try:
            with self.telemetry.decision(route_name, msg):  # telemetry: the decision's span
                return await self._handle(route_name, msg, trace)
        finally:
            _ACT.reset(token)

    async def _handle(self, route_name: str, msg: Message, trace: str | None) -> DecisionRecord:
        started = time.perf_counter()
        rules = self.rules.get(route_name)
        if rules is None:
            return self.reject(
                route_name,
                msg,
                f"unknown route {route_name!r}",
                started=started,
                trace=trace,
                cause="unknown_route",
            )
        self.in_flight += 1
        try:
            rec = await self._decide_and_act(rules, msg)
        except PayloadError as exc:
            return self.reject(route_name, msg, str(exc), started=started, trace=trace)
        finally:
            self.in_flight -= 1
        return self._finish(rec, msg, started, trace)

    def reject(
        self,
        route_name: str,
        msg: Message | None,
        reason: str,
        *,
        started: float | None = None,
        trace: str | None = None,
        message_id: str | None = None,
        cause: str | None = None,
    ) -> DecisionRecord:
        """Record a message that was not understood (the surface answers 4xx)."""
        rules = self.rules.get(route_name)
        rec = DecisionRecord(
            time=self.clock.now(),
            route=route_name,
            decision=Decision.REJECTED,
            enforced=rules.route.enforced if rules else True,
            message_id=msg.message_id if msg else (message_id or ""),
            reason=reason,
        )
        if cause:
            rec.extra["cause"] = cause
        return self._finish(rec, msg, started or time.perf_counter(), trace)

    async def _decide_and_act(self, rules: RouteRules, msg: Message) -> DecisionRecord:
        route = rules.route
        if not rules.accepts_subscription(msg.subscription):
            raise PayloadError(f"pushed from subscription {msg.subscription!r}, route expects {route.subscription!r}")
        # 1. extract
        payload, fp = rules.scheme(msg.data)
        key = rules.key_of(payload, msg.attributes)
        bypass = rules.bypassed(payload, msg.attributes)
        rec = DecisionRecord(
            time=0.0,
            route=route.name,
            decision=Decision.FAILED,
            enforced=route.enforced,
            message_id=msg.message_id,
            key=key,
            fingerprint=fp,
            message_fingerprint=message_fingerprint(msg.data, msg.attributes),
            destination=route.destination,
            publish_time=msg.publish_time,
            delivery_attempt=msg.delivery_attempt,
        )
        if payload is NOT_JSON:
            rec.extra["payload_kind"] = "raw"

        state: KeyState | None = None
        looked = False  # a lost claim already read what beat it: decide again on that, no second read
        for _ in range(CLAIM_ATTEMPTS):
            # 2. look
            if not looked:
                try:
                    state = await self.store.read(route.name, key)
                except StoreUnavailable as exc:
                    return await self._store_down(rules, msg, rec, exc)
            looked = False
            now = self.clock.now()
            if state is not None and state.expired(now):
                state = state.forgotten()  # the TTL may not have run yet: expired state never decides
            # 3. decide
            verdict = judge(route, msg, fp, state, now, bypass)
            rec.previous_fingerprint = state.fingerprint if state else None
            verdict, out, details = look_closer(rules, msg, fp, state, verdict, self.random)
            rec.extra.update(details)
            rec.reason = verdict.reason
            if verdict.decision is not Decision.FORWARDED:
                if route.enforced:
                    rec.decision = verdict.decision
                    return rec
                # shadow mode: publish what enforce mode would hold back, record what it would do
                return await self._forward_unleased(route, msg, rec, verdict.decision)
            # 4. act: claim, publish under a heartbeat, commit
            claimed = await self._claim(route, key, msg, fp, state, now, rec)
            if isinstance(claimed, DecisionRecord):
                return claimed
            held, current = claimed
            if held is None:
                state, looked = current, True  # someone wrote first: re-decide on what they wrote
                continue
            return await self._publish_and_commit(route, key, msg, fp, state, held, rec, out)
        rec.decision = Decision.CONTENDED
        rec.reason = f"lost the claim race {CLAIM_ATTEMPTS} times"
        return rec

    async def _claim(
        self,
        route: Route,
        key: str,
        msg: Message,
        fp: str,
        state: KeyState | None,
        now: float,
        rec: DecisionRecord,
    ) -> tuple[KeyState | None, KeyState | None] | DecisionRecord:
        """Take the lease: (our leased state, None), or (None, the state that beat us)."""
        base = state or KeyState()
        lease = Lease(
            holder=f"{self.instance}/{uuid.uuid4().hex[:8]}",
            fence=base.fence + 1,
            expires_at=now + self.config.lease.duration,
            fingerprint=fp,
            message_id=msg.message_id,
        )
        # Everything else stays as it was: a released lease must leave the last forward intact.
        new = replace(
            base, fence=lease.fence, lease=lease, expires_at=max(base.expires_at or 0.0, now + self._retention(route))
        )
        current = None
        try:
            held = await self.store.claim(route.name, key, state, new)
            if held is None:
                # A claim whose reply was lost may still have landed: ours if the holder token is.
                current = await self.store.read(route.name, key)
                if current is not None and current.lease is not None and current.lease.holder == lease.holder:
                    held, current = current, None
        except StoreUnavailable as exc:
            return await self._store_down(self.rules[route.name], msg, rec, exc)
        if held is not None:
            rec.fence = lease.fence
            if state is not None and state.lease is not None and not state.lease.live(now):
                self.telemetry.lease_taken_over(route.name)  # telemetry
                log.warning(
                    "lease_taken_over",
                    route=route.name,
                    key=key,
                    fence=lease.fence,
                    previous_holder=state.lease.holder,
                    previous_fence=state.lease.fence,
                    expired_for_s=round(now - state.lease.expires_at, 3),
                )
            else:
                log.debug("lease_acquired", route=route.name, key=key, fence=lease.fence)
        return held, current

    async def _publish_and_commit(
        self,
        route: Route,
        key: str,
        msg: Message,
        fp: str,
        state: KeyState | None,
        held: KeyState,
        rec: DecisionRecord,
        out: Outgoing,
    ) -> DecisionRecord:
        heartbeat = Heartbeat(self.store, route.name, key, held, self.config.lease, self.clock)
        out.attributes.update(fence_attributes(key, held.fence))
        try:
            async with heartbeat:
                rec.published_id = await self._publish(route, msg, fp, out)
        except PublishFailed as exc:
            await self._release(route.name, key, heartbeat.held)
            rec.decision = Decision.FAILED
            rec.reason = f"{_cause(exc)} failed: {exc}"
            rec.extra["cause"] = _cause(exc)
            return rec
        except asyncio.CancelledError:
            # Shutting down mid-publish: the message will be redelivered, so free the key now
            # rather than make the redelivery wait out the lease.
            await asyncio.shield(self._release(route.name, key, heartbeat.held))
            raise
        rec.decision = Decision.FORWARDED
        if heartbeat.extended:
            rec.extra["heartbeats"] = heartbeat.extended
        base = state or KeyState()
        now = self.clock.now()
        new = KeyState(
            fingerprint=fp,
            forwarded_at=now,
            message_id=msg.message_id,
            publish_time=msg.publish_time if msg.publish_time is not None else base.publish_time,
            recent=(*base.recent, (msg.message_id, fp))[-RECENT:],
            fence=held.fence,
            lease=None,
            expires_at=now + self._retention(route),
            rows=out.rows,
            full_fingerprint=out.full_fingerprint,
        )
        try:
            committed = await self.store.commit(route.name, key, heartbeat.held, new)
        except Exception as exc:  # whatever the store raised: the publish landed, so this is an ack
            # Published but not recorded: the lease expires and the next copy of this
            # content is forwarded once more. Never nack here: that would publish twice now.
            log.error("commit_failed", route=route.name, key=key, fence=held.fence, error=_describe(exc))
            rec.extra["committed"] = False
            return rec
        if not committed:
            rec.extra["committed"] = False
            log.warning("commit_refused", route=route.name, key=key, fence=held.fence)
        return rec

    async def _release(self, route: str, key: str, held: KeyState) -> None:
        fence = held.lease.fence if held.lease else held.fence
        try:
            await self.store.release(route, key, held)
        except Exception as exc:  # the lease then lapses by itself; the nack still goes out
            log.error("lease_release_failed", route=route, key=key, fence=fence, error=_describe(exc))
            return
        log.info("lease_released", route=route, key=key, fence=fence)

    async def _publish(self, route: Route, msg: Message, fp: str, out: Outgoing | None = None) -> str:
        # Everything inside the try: any failure here must become PublishFailed, so the caller
        # releases the lease and the message is nacked, never left holding the key.
        try:
            attributes = {k: v for k, v in msg.attributes.items() if k not in OWN_ATTRIBUTES}
            if out is not None:
                attributes.update(out.attributes)
            attributes[ATTR_FINGERPRINT] = fp
            attributes[ATTR_SOURCE_ID] = msg.message_id
            attributes[ATTR_ROUTE] = route.name
            if msg.publish_time is not None:
                attributes[ATTR_SOURCE_PUBLISH_TIME] = format_time(msg.publish_time)
            data = out.data if out is not None else msg.data
            act = _ACT.get()
            if act is not None:
                try:
                    return await act(data, attributes)
                except Exception as exc:
                    raise WorkFailed(f"{type(exc).__name__}: {exc}") from exc
            return await self.publisher.publish(route.destination, data, attributes, msg.ordering_key)
        except PublishFailed:
            raise
        except Exception as exc:  # a publisher bug must still nack, never lose the message
            raise PublishFailed(f"{type(exc).__name__}: {exc}") from exc

    async def _forward_unleased(
        self, route: Route, msg: Message, rec: DecisionRecord, decision: Decision
    ) -> DecisionRecord:
        """Publish with no lease and no commit (shadow mode, fail-open): record `decision` once it went out."""
        try:
            rec.published_id = await self._publish(route, msg, rec.fingerprint or "")
        except PublishFailed as exc:
            rec.decision = Decision.FAILED
            failed = f"{_cause(exc)} failed: {exc}"
            rec.reason = f"{rec.reason}; {failed}" if rec.reason else failed
            rec.extra["cause"] = _cause(exc)
            return rec
        rec.decision = decision
        return rec

    async def _store_down(
        self, rules: RouteRules, msg: Message, rec: DecisionRecord, exc: StoreUnavailable
    ) -> DecisionRecord:
        route = rules.route
        log.error("store_unavailable", route=route.name, key=rec.key, error=str(exc), policy=route.on_store_error)
        if route.on_store_error == "retry":
            rec.decision = Decision.FAILED
            rec.reason = f"store unavailable: {exc}"
            rec.extra["cause"] = "store"
            return rec
        rec.reason = f"store unavailable: {exc}"
        return await self._forward_unleased(route, msg, rec, Decision.FAIL_OPEN)

    def _retention(self, route: Route) -> float:
        return max(self.config.state_ttl, route.window or 0.0)

    def _finish(self, rec: DecisionRecord, msg: Message | None, started: float, trace: str | None) -> DecisionRecord:
        rec.time = self.clock.now()
        rec.latency_ms = round((time.perf_counter() - started) * 1000, 3)
        rec.trace = trace
        if msg is not None and rec.delivery_attempt is None:
            rec.delivery_attempt = msg.delivery_attempt
        self.recorder.record(rec)
        self.telemetry.decided(rec)  # telemetry: count it, describe it on its span
        _log_decision(rec)
        return rec


_LEVELS = {
    Decision.FORWARDED: "info",
    Decision.SUPPRESSED: "info",
    Decision.DUPLICATE: "info",
    Decision.CONTENDED: "info",
    Decision.STALE: "warning",
    Decision.NOISE_ONLY: "info",
    Decision.FAIL_OPEN: "error",
    Decision.REJECTED: "warning",
    Decision.FAILED: "error",
}


def _cause(exc: PublishFailed) -> str:
    return "work" if isinstance(exc, WorkFailed) else "publish"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, StoreUnavailable) else str(exc)


def _log_decision(rec: DecisionRecord) -> None:
    fields = {k: v for k, v in rec.as_dict().items() if v is not None}
    if rec.trace:
        fields["trace"] = rec.trace
    log_line(log, _LEVELS[rec.decision], "decision", fields)
