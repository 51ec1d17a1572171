"""`pubsub-filter plan --config NEW [--from OLD]`: what a config deploy changes in what each route
compares, and how many keys it would forward on their next message. Like `terraform plan`:
nothing is written.

Per route: unchanged, narrowed, widened (with the newly compared fields), key changed (a new
keyspace), scheme or rows changed, tolerance changed, added or removed; and from the decision
records (the keys forwarded within `state_ttl`, whose state still lives), how many keys would be
forwarded on their next message because of the change, under each `new_fields` policy. The next
message is taken to repeat the key's last content: a real change forwards whatever the config.

Without `--from`, the old selections are those the state was written under, where the state can
be listed (the embedded SQLite store: each key's stored selection, counted exactly). Exit 0 when
nothing would forward, 2 when something would (under each route's own `new_fields`), 1 on an error.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from pubsub_filter.core.compare.selection import Change, Selection, of_route, parse
from pubsub_filter.core.config.schema import Config, Route, load
from pubsub_filter.core.ports import Failure

#: The exit status when the deploy would forward keys that did not change.
WOULD_FORWARD = 2


@dataclass
class Planned:
    """One route's change, and what it would forward."""

    route: str
    change: str  # unchanged, narrowed, widened, key changed, scheme changed, rows changed, tolerance changed, ...
    summary: str = ""
    selection: str | None = None  # the new selection's id
    selection_before: str | None = None
    newly_compared: list[str] | None = None  # None: every field but some (an include list dropped)
    keys: int | None = None  # keys with live state under the old selection (None: not known)
    keys_from: str = ""
    forward: int | None = None  # keys forwarded on their next message under new_fields: forward
    adopt: int | None = None  # ... under new_fields: adopt
    new_fields: str = "forward"  # the route's policy
    unstamped: int = 0  # keys written before selections were stored
    notes: list[str] = field(default_factory=list)

    @property
    def forwards(self) -> int | None:
        """Under the route's own policy."""
        return self.adopt if self.new_fields == "adopt" else self.forward


def _counts(change: Change, keys: int | None) -> tuple[int | None, int | None, list[str]]:
    """(forwarded under `forward`, under `adopt`, notes) for `keys` keys under `change`."""
    kind = change.kind()
    if kind in ("key changed", "scheme changed", "rows changed") or change.new.scheme != "canonical":
        why = {
            "key changed": "a new keyspace, not a selection change: every key is new",
            "scheme changed": "other fingerprints: nothing to compare with",
            "rows changed": "other rows: nothing to compare with",
        }.get(kind, f"scheme {change.new.scheme} keeps no field checksums: nothing to compare with")
        return keys, keys, [why]
    if kind == "widened":
        return (
            keys,
            0 if keys is not None else None,
            ["forward: once, each key whose payload has a newly compared field"],
        )
    if kind == "tolerance changed":
        return 0, 0, ["a move the old tolerance held back and the new one does not is forwarded as a change"]
    return 0, 0, []


def plan(new: Config, old: Config | None, records: Any | None, now: float) -> list[Planned]:
    """Every route's plan. `old`: the config deployed now (None: read the state's selections);
    `records`: a reader with `keys_forwarded` (None: no records to count keys from)."""
    out: list[Planned] = []
    since = now - new.state_ttl
    for route in new.routes:
        sel = of_route(route)
        if old is not None:
            before = old.route(route.name)
            if before is None:
                out.append(Planned(route.name, "added", "its keys are new", sel.id, new_fields=route.new_fields))
                continue
            keys = records.keys_forwarded(route.name, since) if records is not None else None
            p = _planned(route, sel, of_route(before), keys, "decision records" if records is not None else "")
            p.unstamped = _unstamped(new, route.name, now)
            if p.unstamped and p.change != "unchanged":
                # judged as the new selection, against a fingerprint of the old one: forwarded
                p.forward = None if p.forward is None else max(p.forward, p.unstamped)
                p.adopt = None if p.adopt is None else max(p.adopt, p.unstamped)
                p.notes.append(
                    f"{p.unstamped} keys were stored before selections were: they are judged as the route's "
                    "selection now and forward as `content changed`"
                )
            out.append(p)
            continue
        out.extend(_from_state(new, route, sel, now))
    if old is not None:
        names = {r.name for r in new.routes}
        for gone in old.routes:
            if gone.name not in names:
                out.append(Planned(gone.name, "removed", "its state is left to expire (state_ttl)", of_route(gone).id))
    return out


def _planned(route: Route, sel: Selection, before: Selection, keys: int | None, source: str) -> Planned:
    if before.text == sel.text:
        return Planned(
            route.name,
            "unchanged",
            "",
            sel.id,
            before.id,
            keys=keys,
            keys_from=source,
            forward=0,
            adopt=0,
            new_fields=route.new_fields,
        )
    change = Change(before, sel)
    forward, adopt, notes = _counts(change, keys)
    kind = change.kind()
    newly = change.newly_named() if kind == "widened" else None
    return Planned(
        route.name,
        kind,
        change.summary(),
        sel.id,
        before.id,
        newly,
        keys,
        source,
        forward,
        adopt,
        route.new_fields,
        notes=notes,
    )


def _unstamped(cfg: Config, route: str, now: float) -> int:
    if cfg.store.backend != "sqlite":
        return 0
    from pubsub_filter.backends.stores.sqlite import selections

    return (selections(cfg.store.path, route, now) or {}).get(None, 0)


def _from_state(cfg: Config, route: Route, sel: Selection, now: float) -> list[Planned]:
    """The route against each selection its live keys were stored under (the SQLite store only)."""
    if cfg.store.backend != "sqlite":
        raise Failure("the state is in Firestore, which plan does not list: give --from OLD (the config deployed now)")
    from pubsub_filter.backends.stores.sqlite import selections

    found = selections(cfg.store.path, route.name, now) or {}
    unstamped = found.pop(None, 0)
    out = []
    for text, n in sorted(found.items(), key=lambda kv: -kv[1]):
        before = parse(text) if text is not None else None
        if before is None:
            p = Planned(route.name, "not known", "stored by a later version", sel.id, keys=n, keys_from="state")
            out.append(p)
            continue
        out.append(_planned(route, sel, before, n, "state"))
    if not out:
        out.append(
            Planned(
                route.name,
                "unchanged",
                "",
                sel.id,
                keys=0,
                keys_from="state",
                forward=0,
                adopt=0,
                new_fields=route.new_fields,
            )
        )
    if unstamped:
        out[0].unstamped = unstamped
        out[0].notes.append(
            f"{unstamped} keys were stored before selections were: they are judged as the route's selection "
            "now; if it changed since they were stored they forward as `content changed` (give --from OLD)"
        )
    return out


def selection_notes(cfg: Config, source: str) -> list[str]:
    """For `check`: the routes whose live state was stored under another selection than the
    config's, where that is cheap to know (the SQLite store: one grouped read, nothing written)."""
    if cfg.store.backend != "sqlite":
        return []
    from pubsub_filter.backends.stores.sqlite import selections

    now, out = time.time(), []
    for route in cfg.routes:
        found = selections(cfg.store.path, route.name, now) or {}
        sel = of_route(route)
        other = {t: n for t, n in found.items() if t is not None and t != sel.text}
        if other:
            kinds = sorted({Change(b, sel).kind() for t in other if (b := parse(t)) is not None} or {"changed"})
            out.append(
                f"route {route.name}: {sum(other.values())} keys were stored under another selection "
                f"({', '.join(kinds)}): see what their next messages forward with pubsub-filter plan --config {source}"
            )
    return out


def render(plans: list[Planned]) -> str:
    lines = []
    for p in plans:
        head = f"route {p.route}: {p.change}" + (f" ({p.summary})" if p.summary else "")
        lines.append(head)
        if p.selection_before is not None and p.selection_before != p.selection:
            lines.append(f"  selection {p.selection_before} -> {p.selection}")
        if p.newly_compared:
            lines.append(f"  newly compared: {', '.join(p.newly_compared)}")
        elif p.change == "widened" and p.newly_compared is None:
            lines.append("  newly compared: every field the old include list left out")
        if p.change not in ("added", "removed", "not known"):
            keys = "not known" if p.keys is None else str(p.keys)
            lines.append(f"  keys: {keys}" + (f" (from the {p.keys_from})" if p.keys_from else ""))
            lines.append(
                f"  forwarded on their next message: new_fields forward {_n(p.forward)}, adopt {_n(p.adopt)}"
                f" (the route says {p.new_fields})"
            )
        lines += [f"  {note}" for note in p.notes]
    total = [p.forwards for p in plans if p.change not in ("added", "removed", "not known")]
    if any(n is None or n > 0 for n in total):
        known = sum(n for n in total if n is not None)
        lines.append(f"plan: {known}{'+' if None in total else ''} keys would forward on their next message")
    else:
        lines.append("plan: nothing would forward that did not change")
    return "\n".join(lines)


def _n(n: int | None) -> str:
    return "not known" if n is None else str(n)


def exit_status(plans: list[Planned]) -> int:
    counted = [p.forwards for p in plans if p.change not in ("added", "removed", "not known")]
    return WOULD_FORWARD if any(n is None or n > 0 for n in counted) else 0


def run(args: argparse.Namespace, config_path: str) -> int:
    new = load(config_path)
    old = load(args.old) if args.old else None
    records = _records(new, args.records) if old is not None else None
    try:
        plans = plan(new, old, records, time.time())
    finally:
        if records is not None:
            records.close()
    if args.format == "json":
        print(msgspec.json.encode([{**asdict(p), "forwards": p.forwards} for p in plans]).decode())
    else:
        print(render(plans))
    return exit_status(plans)


def _records(cfg: Config, path: str | None) -> Any:
    """Where the keys are counted from: `--records FILE` (an embedded records file), else the
    config's records backend (the SQLite file, or the BigQuery table)."""
    if path is not None:
        from pubsub_filter.backends.records.sqlite import SqliteReader

        return SqliteReader(path)
    from pubsub_filter.runtime.wiring import make_reader

    return make_reader(cfg)
