"""`pubsub-filter explain`: what the filter would decide for a payload, and why. Reads, never writes.

Uses the engine's own pieces (`RouteRules` and the decision itself, `decide`) so the
explanation cannot drift from the decision.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict
from typing import Any

import msgspec

from pubsub_filter.backends.stores.sqlite import read_only
from pubsub_filter.core.attributes import CHANGED_PREFIX
from pubsub_filter.core.compare.canonical import MissingField
from pubsub_filter.core.compare.fingerprint import NOT_JSON, PayloadError, message_fingerprint
from pubsub_filter.core.compare.keyless import keyless
from pubsub_filter.core.compare.routes import RouteRules
from pubsub_filter.core.config.amounts import parse_amount
from pubsub_filter.core.config.schema import Config, Route
from pubsub_filter.core.engine.judge import decide
from pubsub_filter.core.model import Decision, KeyState, Message
from pubsub_filter.runtime.wiring import make_store


class _AlwaysSampled(random.Random):
    """An rng whose every draw is 0.0: any sampling rate above zero takes the sample."""

    def random(self) -> float:
        return 0.0


def _when(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _state(state: KeyState | None, now: float) -> dict[str, Any] | None:
    if state is None:
        return None
    out: dict[str, Any] = {
        "fingerprint": state.fingerprint,
        "forwarded_at": _when(state.forwarded_at),
        "source_message_id": state.message_id,
        "source_publish_time": _when(state.publish_time),
        "fence": state.fence,
        "recent_message_ids": [m for m, _ in state.recent],
        "expires_at": _when(state.expires_at),
    }
    if state.lease is not None:
        lease = asdict(state.lease)
        lease["expires_at"] = _when(state.lease.expires_at)
        lease["live"] = state.lease.live(now)
        out["lease"] = lease
    return out


async def _stored(cfg: Config, route: str, key: str) -> KeyState | None:
    """The key's stored state, read without writing: the embedded store would create its file and schema on open."""
    if cfg.store.backend == "sqlite":
        return read_only(cfg.store.path, route, key)
    store = make_store(cfg)
    try:
        return await store.read(route, key)
    finally:
        await store.close()


async def explain(cfg: Config, route: Route, msg: Message) -> dict[str, Any]:
    rules = RouteRules(route)
    attributes = msg.attributes
    try:
        payload, fp, message_fp, raw, typed = rules.extract(msg)  # the engine's own step 1
        key = rules.key_of(payload, attributes)
    except MissingField as exc:
        return _keyless(rules, msg, exc)
    state = await _stored(cfg, route.name, key)
    now = time.time()
    # The engine audits a sample of suppressions; explain shows what the audit would find for
    # this message, whatever the route's rate (a route with no audit has nothing to compare).
    bypass = rules.bypassed(payload, attributes)
    decided = decide(rules, msg, fp, state, now, bypass, _AlwaysSampled(), payload, typed)
    result: dict[str, Any] = {
        "route": route.name,
        "key": key,
        "scheme": route.scheme
        + (
            ""
            if not raw
            else " (payload is not JSON: raw bytes)"
            if payload is NOT_JSON
            else " (raw bytes: a number beyond double range)"
        ),
        "payload_fingerprint": fp,
        "message_fingerprint": message_fp,
        "stored": _state(state, now),
        "decision": str(decided.verdict.decision),
        "reason": decided.verdict.reason,
        "enforced": route.enforced,
    }
    if route.tolerance:
        result["tolerance"] = {f: str(parse_amount(v)) for f, v in route.tolerance.items()}
    if route.coalesce is not None:
        # what the running filter does before this decision (`pubsub_filter.core.engine.coalescing`)
        result["coalesce"] = {"quiet_s": route.coalesce.quiet, "max_wait_s": route.coalesce.max_wait}
    result.update(decided.details)
    if decided.out.attributes:
        result["forward_attributes"] = decided.out.attributes
    return result


def _keyless(rules: RouteRules, msg: Message, missing: MissingField) -> dict[str, Any]:
    """What the engine does with a message whose key cannot be read: forward it without a look
    at any state (`pubsub_filter.core.compare.keyless`), or reject it (raised, as any payload error)."""
    k = keyless(rules, msg.data, missing)
    route = rules.route
    return {
        "route": route.name,
        "key": None,
        "scheme": route.scheme + (" (over the raw bytes)" if k.raw else ""),
        "payload_fingerprint": k.fingerprint,
        "message_fingerprint": message_fingerprint(msg.data, msg.attributes),
        "stored": None,
        "decision": str(Decision.FAIL_OPEN),
        "reason": k.reason,
        "enforced": route.enforced,
        "missing_field": k.missing,
    }


def render(result: dict[str, Any]) -> str:
    missing = result.get("missing_field")
    lines = [
        f"route:        {result['route']}",
        f"key:          {result['key'] if missing is None else f'none: {missing} cannot be read'}",
        f"fingerprint:  {result['payload_fingerprint']}  ({result['scheme']})",
        f"message:      {result['message_fingerprint']}",
    ]
    stored = result["stored"]
    if missing is not None:
        lines.append("stored:       not read: with no key there is no state, and nothing is written")
    elif stored is None:
        lines.append("stored:       nothing for this key yet")
    else:
        # No fingerprint after a forward: what the destination holds is unknown (`KeyState.downstream`).
        content = stored["fingerprint"] or ("unknown downstream" if stored["forwarded_at"] else "nothing forwarded")
        lines.append(
            f"stored:       {content}  forwarded {stored['forwarded_at']} "
            f"from message {stored['source_message_id']} (fence {stored['fence']})"
        )
        if "lease" in stored:
            lease = stored["lease"]
            state = "live" if lease["live"] else "expired"
            lines.append(
                f"lease:        {state}, holder {lease['holder']}, fence {lease['fence']}, until {lease['expires_at']}"
            )
    shadow = "" if result["enforced"] else "  (shadow mode: would be; everything is forwarded)"
    lines.append(f"decision:     {result['decision']}: {result['reason']}{shadow}")
    if (coalesce := result.get("coalesce")) is not None:
        lines.append(
            f"coalesce:     held first: decided so only if it is the newest of its key's burst once the key was "
            f"quiet {coalesce['quiet_s']:g}s (at most {coalesce['max_wait_s']:g}s after the burst's first message); "
            "an older message of the burst is answered superseded"
        )
    if "rows_total" in result:
        lines.append(
            f"rows:         {result['rows_total']} in payload; {result['rows_added']} added, "
            f"{result['rows_changed']} changed, {result['rows_removed']} removed"
        )
        for change in result.get("changes", []):
            what = (
                "added" if change.get("added") else "removed" if change.get("removed") else ", ".join(change["fields"])
            )
            lines.append(f"  {change['row']}: {what}")
    lines += _tolerance_lines(result)
    lines += _selection_lines(result)
    return "\n".join(lines)


def _selection_lines(result: dict[str, Any]) -> list[str]:
    """A last forward judged under another selection than the route's, in words."""
    if "selection_before" not in result:
        return []
    change = result["selection_change"]
    if change == "key changed":
        return [
            f"selection:    the route's key changed since the last forward ({result['selection_before']} -> "
            f"{result['selection']}): a new keyspace, decided as a new key"
        ]
    lines = [
        f"selection:    {change}: the last forward was judged under selection {result['selection_before']}, "
        f"the route's is {result['selection']} (pubsub-filter plan shows what the change forwards)"
    ]
    if result.get("newly_compared"):
        lines.append(f"              newly compared: {', '.join(result['newly_compared'])}")
    if result.get("selection_unjudged"):
        lines.append(f"              not compared field by field: {result['selection_unjudged']}")
    return lines


def _tolerance_lines(result: dict[str, Any]) -> list[str]:
    """The tolerance and the changed-field flags, in words."""
    lines = []
    amounts = result.get("tolerance", {})
    moves = result.get("within_tolerance")
    if moves:
        said = ", ".join(f"{f} moved {m:g} (tolerance {amounts.get(f, '?')})" for f, m in sorted(moves.items()))
        where = "in the rows held back" if result.get("rows_within_tolerance") else "since the last forward"
        lines.append(f"tolerance:    {said}: within tolerance of the value last forwarded, {where}")
    if result.get("rows_within_tolerance"):
        lines.append(
            f"              {result['rows_within_tolerance']} changed rows moved only within tolerance: not sent, "
            "each still compared with the value last forwarded for it"
        )
    if "changed_flagged" in result:
        flagged = result["changed_flagged"]
        lines.append(
            "flags:        "
            + (", ".join(f"{CHANGED_PREFIX}{f}" for f in flagged) if flagged else "none")
            + " (changed since the last forward, beyond any tolerance)"
        )
    if result.get("tolerance_state"):
        lines.append(f"tolerance:    no reference kept: {result['tolerance_state']}")
    for state in ("rows_state", "fields_state"):
        if result.get(state):
            lines.append(f"{state.replace('_', ' ') + ':':<14}{result[state]}")
    return lines


def run(cfg: Config, route: Route, msg: Message, fmt: str) -> int:
    try:
        result = asyncio.run(explain(cfg, route, msg))
    except PayloadError as exc:
        if fmt == "json":  # a script reading stdout gets the decision, as for any other message
            rejected = {"route": route.name, "decision": str(Decision.REJECTED), "reason": f"payload rejected: {exc}"}
            print(msgspec.json.encode(rejected).decode())
        raise  # the command's one line on stderr, exit 1
    print(msgspec.json.encode(result).decode() if fmt == "json" else render(result))
    return 0
