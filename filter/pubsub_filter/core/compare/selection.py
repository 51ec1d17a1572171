"""A route's selection: what decides "changed" (the key, the fields compared, the rows, the
tolerance, the fingerprint scheme), as stored with each forward. Pure, no I/O.

The selection is written with every forward's state (`KeyState.selection`) as its canonical
JSON text (`Selection.text`: keys sorted, empty parts left out), so a later decision tells
"the content changed" from "what the route compares changed", and can say what changed in
it, with no registry of old configs to consult. Its id (`Selection.id`, 16 hex of its SHA-256)
is what `plan`, `check` and the records show. The route's name, destination, mode, window,
attributes and `new_fields` are not part of it: changing those changes no comparison.

State written before selections were stored has none (`KeyState.selection` is None): it is
read as the selection the route has now, as it always was.

A changed `key` is not a selection change but a new keyspace: the state a key finds was
written for other key values (or the same values read from other fields), so it is decided
as a new key (`Change.key_changed`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import msgspec

from pubsub_filter.core.config.schema import Route

_encode = msgspec.json.Encoder(order="sorted").encode


class _Spec(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=False):
    """The stored form: what a route compares. Defaults are left out of the text."""

    key: list[str]
    include: list[str] = []
    exclude: list[str] = []
    rows: str | None = None
    row_key: list[str] = []
    tolerance: dict[str, int | float | str] = {}
    scheme: str = "canonical"


_decode_spec = msgspec.json.Decoder(_Spec).decode


@dataclass(frozen=True, slots=True)
class Selection:
    """What a route compares, and its stored text and id."""

    key: tuple[str, ...]
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    rows: str | None
    row_key: tuple[str, ...]
    tolerance: tuple[tuple[str, int | float | str], ...]
    scheme: str
    text: str

    @property
    def id(self) -> str:
        return selection_id(self.text)

    def counts(self) -> Callable[[str], bool]:
        """Whether a field (top-level, or of a row on a rows route) is compared."""
        exclude = frozenset(self.exclude)
        include = frozenset(k for k in self.include if k not in exclude)
        if include:
            return include.__contains__
        return lambda name: name not in exclude

    def describe(self) -> str:
        """The comparison in a few words, for `plan`."""
        parts = [f"key {', '.join(self.key)}"]
        if self.rows is not None:
            parts.append(f"rows {self.rows}" + (f" by {', '.join(self.row_key)}" if self.row_key else ""))
        if self.include:
            parts.append(f"include {', '.join(self.include)}")
        if self.exclude:
            parts.append(f"exclude {', '.join(self.exclude)}")
        if self.tolerance:
            parts.append("tolerance " + ", ".join(f"{k} {v}" for k, v in self.tolerance))
        if self.scheme != "canonical":
            parts.append(f"scheme {self.scheme}")
        return "; ".join(parts)


def selection_id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def of_route(route: Route) -> Selection:
    """The route's selection, computed once at config load (`RouteRules`)."""
    spec = _Spec(
        key=[str(p) for p in route.key],
        include=list(route.include),
        exclude=sorted(route.exclude),
        rows=str(route.rows) if route.rows is not None else None,
        row_key=list(route.row_key),
        tolerance=dict(route.tolerance),
        scheme=route.scheme,
    )
    return _of_spec(spec, _encode(spec).decode())


def _of_spec(spec: _Spec, text: str) -> Selection:
    return Selection(
        tuple(spec.key),
        tuple(spec.include),
        tuple(spec.exclude),
        spec.rows,
        tuple(spec.row_key),
        tuple(sorted(spec.tolerance.items())),
        spec.scheme,
        text,
    )


@lru_cache(maxsize=256)
def parse(text: str) -> Selection | None:
    """A stored selection, decoded once per distinct text; None when it cannot be read (a later
    version's, say): then nothing is known of what the last forward compared."""
    try:
        return _of_spec(_decode_spec(text), text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


@dataclass(frozen=True, slots=True)
class Change:
    """How the selection `old` (the stored one) differs from `new` (the route's)."""

    old: Selection
    new: Selection

    @property
    def key_changed(self) -> bool:
        return self.old.key != self.new.key

    @property
    def scheme_changed(self) -> bool:
        return self.old.scheme != self.new.scheme

    @property
    def rows_changed(self) -> bool:
        return self.old.rows != self.new.rows or self.old.row_key != self.new.row_key

    @property
    def fields_changed(self) -> bool:
        return set(self.old.include) != set(self.new.include) or set(self.old.exclude) != set(self.new.exclude)

    @property
    def fingerprints_comparable(self) -> bool:
        """Only the tolerance changed: a tolerance changes no fingerprint, so the stored one
        is compared as it is (and the tolerance reference with the new amounts)."""
        return not (self.key_changed or self.scheme_changed or self.rows_changed or self.fields_changed)

    def newly_compared(self, names: Any) -> list[str]:
        """Of `names`, those the new selection compares and the old one did not (sorted)."""
        was, now = self.old.counts(), self.new.counts()
        return sorted(n for n in names if now(n) and not was(n))

    def no_longer_compared(self, names: Any) -> list[str]:
        was, now = self.old.counts(), self.new.counts()
        return sorted(n for n in names if was(n) and not now(n))

    def widens(self) -> bool | None:
        """Whether the new selection may compare a field the old one did not: True, False, or
        None when that depends on the payload (a switch between `include` and `exclude`)."""
        o, n = self.old, self.new
        if n.include and o.include:
            return bool(_counted(n) - _counted(o))
        if not n.include and not o.include:
            return bool(set(o.exclude) - set(n.exclude))
        if n.include and not o.include:
            return bool(_counted(n) & set(o.exclude))
        return True  # from a list of included fields to all but some: every other field is new

    def newly_named(self) -> list[str] | None:
        """The fields the new selection compares and the old did not, by name; None when they
        are every field but some (from a list of included fields to all but the excluded)."""
        o, n = self.old, self.new
        if n.include and o.include:
            return sorted(_counted(n) - _counted(o))
        if n.include:
            return sorted(_counted(n) & set(o.exclude))
        if not o.include:
            return sorted(set(o.exclude) - set(n.exclude))
        return None

    def summary(self) -> str:
        """What changed, in words: the reason of a decision under the changed selection names it."""
        o, n = self.old, self.new
        if self.key_changed:
            return f"key {', '.join(o.key)} -> {', '.join(n.key)}: a new keyspace"
        out: list[str] = []
        if self.scheme_changed:
            out.append(f"scheme {o.scheme} -> {n.scheme}")
        if o.rows != n.rows:
            out.append(f"rows {o.rows or '-'} -> {n.rows or '-'}")
        if o.row_key != n.row_key:
            out.append(f"row_key {list(o.row_key)} -> {list(n.row_key)}")
        if set(o.include) != set(n.include):
            added, dropped = sorted(set(n.include) - set(o.include)), sorted(set(o.include) - set(n.include))
            out.append("include" + "".join(f" +{a}" for a in added) + "".join(f" -{d}" for d in dropped))
        if set(o.exclude) != set(n.exclude):
            added, dropped = sorted(set(n.exclude) - set(o.exclude)), sorted(set(o.exclude) - set(n.exclude))
            out.append("exclude" + "".join(f" +{a}" for a in added) + "".join(f" -{d}" for d in dropped))
        if o.tolerance != n.tolerance:
            was, now = dict(o.tolerance), dict(n.tolerance)
            names = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
            out.append("tolerance " + ", ".join(f"{k} {was.get(k, '-')} -> {now.get(k, '-')}" for k in names))
        return "; ".join(out) or "reordered"

    def kind(self) -> str:
        """`key changed`, `scheme changed`, `rows changed`, `narrowed`, `widened`, `tolerance changed`."""
        if self.key_changed:
            return "key changed"
        if self.scheme_changed:
            return "scheme changed"
        if self.rows_changed:
            return "rows changed"
        if self.fields_changed:
            return "narrowed" if self.widens() is False else "widened"
        return "tolerance changed"


def _counted(s: Selection) -> set[str]:
    return set(s.include) - set(s.exclude)


#: The reason of every decision taken under another selection than the last forward's starts so
#: (the records readers count these apart: `FORWARDED_LABEL`, `SUPPRESSED_LABEL`).
SELECTION_CHANGED = "selection changed"
#: What `skip-rate` counts a forward and a suppression under a changed selection as.
FORWARDED_LABEL = "selection_forwarded"
SUPPRESSED_LABEL = "selection_suppressed"
