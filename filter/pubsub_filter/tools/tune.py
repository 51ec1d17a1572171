"""`pubsub-filter tune`: which fields make a route's messages look changed, and what another
selection would have skipped, from the decisions already recorded.

What it reads (`pubsub_filter.core.compare.fields`, and `rows.diff` for row routes): every forward whose
content changed records `fields_changed`, the selected fields that changed since the last
forward for the key, and `fields_increased`, those of them whose value grew (numbers, ISO 8601
times: compared to the last forward's value); a suppression records `excluded_changed`, the
fields outside the selection that changed. Per field, over the forwards whose content
changed and whose fields are known:

* changed: in what share of them the field changed;
* alone: in what share it was the only change (excluding it would have skipped those);
* increased: in what share of its changes its value grew. A field that changed at least
  `CLOCK_MIN` times and grew in at least `CLOCK_SHARE` of them looks like a clock: churn.
  Any other changing field is signal.

The what-if (`--exclude F`, `--include F`): a forward whose content changed is still a
forward if a field it changed is in the new selection (a change to the row set always
counts), else it would have been suppressed; a suppression becomes a forward if a field it
recorded in `excluded_changed` is in the new selection. Every other decision stays as it was
(new keys, window expiries, bypasses, duplicates, stale messages). Changes are relative to
the last *actual* forward, which is exact for excluding fields (a message the new selection
would have suppressed changed nothing selected, so the next one's changes are the same
against either baseline) and an estimate for bringing fields back in.

Honest limits: a forward whose changed fields were not recorded (decided before this
feature, or after a row state too large to keep) cannot be evaluated; the coverage line says
how much of the window could be. A suppression recorded without `excluded_changed` counts as
nothing outside the selection having changed. Row routes record no values, so no clock.
A shadow route's decisions are what enforce mode would have done: its "had" is `would_skip`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from pubsub_filter.core.config.amounts import Amount
from pubsub_filter.core.ports import DecisionRow, RecordsLister
from pubsub_filter.core.times import parse_duration
from pubsub_filter.tools import tune_coalesce
from pubsub_filter.tools.skiprate import reader_for, since_of
from pubsub_filter.tools.skiprows import DECIDED, SKIPPED
from pubsub_filter.tools.tune_moves import MoveStats, ToleranceWhatIf, move_stats, parse_tolerances, values_recorded

#: A field whose value grew in at least this share of its changes looks like a clock ...
CLOCK_SHARE = 0.9
#: ... once it changed at least this many times.
CLOCK_MIN = 3
#: The forward reason of a content change (`pubsub_filter.core.engine.judge.judge`): the what-if applies to those.
CONTENT_CHANGED = "content changed"
_ROWS = "(rows added or removed)"
_MORE = "(fields past the recorded list)"


@dataclass(frozen=True)
class FieldStats:
    name: str
    changed: int  # forwards in which it changed
    alone: int  # forwards in which it was the only change
    increased: int  # of those changes, how many grew
    changed_share: float  # percent of the evaluated content forwards
    alone_share: float
    increased_share: float | None  # percent of its changes; None when no value was comparable
    clock: bool
    verdict: str  # churn | signal
    excluded_changes: int = 0  # suppressions in which it changed outside the selection


@dataclass(frozen=True)
class Analysis:
    """`analyse`'s numbers: per field, and the skip rate had and would have had."""

    decided: int  # acked decisions in the window
    evaluable: int  # of those, the ones the what-if could evaluate
    content_forwards: int  # forwards whose content changed, with their fields known
    skipped: int  # held back (suppressed, duplicate, stale, noise_only), over all decided
    skipped_evaluable: int  # held back, over the evaluable ones
    would_skip: int  # held back under the selection asked for, over the evaluable ones
    exclude: tuple[str, ...]
    include: tuple[str, ...]
    fields: tuple[FieldStats, ...]
    excluded_fields: dict[str, int] = field(default_factory=dict)  # field → suppressions it changed in
    suggestions: tuple[str, ...] = ()
    tolerance: dict[str, str] = field(default_factory=dict)  # the what-if's, as given
    moves: tuple[MoveStats, ...] = ()  # how far numbers move between forwards (`tune_moves`)
    values_recorded: bool = True  # False on a row route: no moves, no tolerance what-if

    @property
    def had_rate(self) -> float | None:
        return _pct(self.skipped, self.decided)

    @property
    def had_rate_evaluable(self) -> float | None:
        return _pct(self.skipped_evaluable, self.evaluable)

    @property
    def would_rate(self) -> float | None:
        return _pct(self.would_skip, self.evaluable)

    @property
    def coverage(self) -> float | None:
        return _pct(self.evaluable, self.decided)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fields"] = [asdict(f) for f in self.fields]
        out.update(
            had_skip_rate=_round(self.had_rate),
            had_skip_rate_evaluable=_round(self.had_rate_evaluable),
            would_skip_rate=_round(self.would_rate),
            coverage=_round(self.coverage),
        )
        return out


def _pct(n: int, of: int) -> float | None:
    return None if of == 0 else 100.0 * n / of


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def _changes(row: DecisionRow) -> set[str] | None:
    """What a content forward changed: its fields, and the row set; None when not recorded."""
    extra = row["extra"]
    names = extra.get("fields_changed")
    if not isinstance(names, list):
        return None
    out = {str(n) for n in names}
    if extra.get("fields_changed_more"):
        out.add(_MORE)
    if extra.get("rows_added") or extra.get("rows_removed"):
        out.add(_ROWS)
    return out


def _counts(name: str, include: frozenset[str], exclude: frozenset[str]) -> bool:
    """Whether a change to `name` makes a forward under the selection asked for."""
    if name in (_ROWS, _MORE):
        return True  # not a field a selection can leave out (or one not named): still a change
    return name not in exclude and (not include or name in include)


def _would_skip(row: DecisionRow, include: frozenset[str], exclude: frozenset[str]) -> bool | None:
    """Whether the decision would have held the message back under the selection; None: cannot tell."""
    decision = row["decision"]
    if decision in SKIPPED:
        changed = row["extra"].get("excluded_changed")
        if decision in ("suppressed", "noise_only") and include and isinstance(changed, list):
            return not any(_counts(str(n), include, exclude) for n in changed)
        return True
    if decision != "forwarded" or row["reason"] != CONTENT_CHANGED:
        return False  # new key, window, bypass, unknown downstream, fail_open: forwarded anyway
    changes = _changes(row)
    if changes is None:
        return None
    return not any(_counts(n, include, exclude) for n in changes)


def analyse(
    records: Iterable[DecisionRow],
    exclude: Sequence[str] = (),
    include: Sequence[str] = (),
    suggest: bool = True,
    tolerance: Mapping[str, Amount] | None = None,
) -> Analysis:
    """Per-field churn and the what-if skip rate over `records` (one route's, in time order)."""
    rows = [r for r in records if r["decision"] in DECIDED]
    inc, exc = frozenset(include), frozenset(exclude)
    recorded = values_recorded(rows)
    what_if = ToleranceWhatIf(tolerance) if tolerance and recorded else None
    changed: dict[str, int] = {}
    alone: dict[str, int] = {}
    increased: dict[str, int] = {}
    excluded: dict[str, int] = {}
    content = evaluable = skipped = skipped_evaluable = would = 0
    for row in rows:
        held = row["decision"] in SKIPPED
        skipped += held
        verdict = _would_skip(row, inc, exc)
        if what_if is not None and row["decision"] == "forwarded":
            verdict = _tolerated(what_if, row, verdict, inc, exc)
        if verdict is not None:
            evaluable += 1
            skipped_evaluable += held
            would += verdict
        extra = row["extra"]
        for n in extra.get("excluded_changed") or ():
            excluded[n] = excluded.get(n, 0) + 1
        if row["decision"] != "forwarded" or row["reason"] != CONTENT_CHANGED:
            continue
        changes = _changes(row)
        if changes is None:
            continue
        content += 1
        named = changes - {_ROWS, _MORE}
        for n in named:
            changed[n] = changed.get(n, 0) + 1
        if len(changes) == 1 and named:
            (only,) = named
            alone[only] = alone.get(only, 0) + 1
        for n in extra.get("fields_increased") or ():
            increased[n] = increased.get(n, 0) + 1
    stats = tuple(
        sorted(
            (_stats(n, changed[n], alone.get(n, 0), increased.get(n, 0), content) for n in changed),
            key=lambda s: (-s.alone, -s.changed, s.name),
        )
    )
    result = Analysis(
        decided=len(rows),
        evaluable=evaluable,
        content_forwards=content,
        skipped=skipped,
        skipped_evaluable=skipped_evaluable,
        would_skip=would,
        exclude=tuple(exclude),
        include=tuple(include),
        fields=stats,
        excluded_fields=dict(sorted(excluded.items(), key=lambda kv: -kv[1])),
        tolerance={n: str(a) for n, a in (tolerance or {}).items()},
        moves=move_stats(rows, CONTENT_CHANGED) if recorded else (),
        values_recorded=recorded,
    )
    if not suggest:
        return result
    return Analysis(**{**result.__dict__, "suggestions": _suggestions(rows, result)})


def _tolerated(
    what_if: ToleranceWhatIf, row: DecisionRow, verdict: bool | None, inc: frozenset[str], exc: frozenset[str]
) -> bool | None:
    """The verdict of an actual forward under the tolerance asked for (`tune_moves`)."""
    what_if.observe(row)
    content = row["reason"] == CONTENT_CHANGED
    if verdict is False and content:
        changes = _changes(row) or set()
        if what_if.holds_back(row, {n for n in changes if _counts(n, inc, exc)}):
            return True
    what_if.forwarded(row, content)
    return verdict


def _stats(name: str, changed: int, alone: int, increased: int, content: int) -> FieldStats:
    clock = changed >= CLOCK_MIN and increased >= CLOCK_SHARE * changed
    return FieldStats(
        name=name,
        changed=changed,
        alone=alone,
        increased=increased,
        changed_share=round(100.0 * changed / content, 2),
        alone_share=round(100.0 * alone / content, 2),
        increased_share=round(100.0 * increased / changed, 2) if increased else None,
        clock=clock,
        verdict="churn" if clock else "signal",
    )


def _suggestions(rows: list[DecisionRow], a: Analysis) -> tuple[str, ...]:
    out = []
    for f in a.fields:
        if f.verdict != "churn" or f.name in a.exclude:
            continue
        then = analyse(rows, (*a.exclude, f.name), a.include, suggest=False)
        out.append(
            f"exclude {f.name}: changed alone in {f.alone_share:.0f} % of forwards (changed in "
            f"{f.changed_share:.0f} %), values increase with publish time in {f.increased_share or 0:.0f} % "
            f"of its changes: looks like a scrape timestamp; excluding it would have skipped "
            f"{_show(then.would_rate)} of the messages evaluated (had {_show(then.had_rate_evaluable)})"
        )
    return tuple(out)


def _show(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.1f} %"


def render(route: str, a: Analysis, fmt: str) -> str:
    if fmt == "json":
        return msgspec.json.encode({"route": route, **a.as_dict()}).decode()
    lines = [
        f"route {route}: {a.decided} decisions, {a.evaluable} evaluable ({_show(a.coverage)}); "
        f"{a.decided - a.evaluable} forwards without their changed fields recorded cannot be evaluated",
        "",
    ]
    if a.fields:
        table = [("field", "changed", "alone", "increased", "verdict")]
        for f in a.fields:
            share = "-" if f.increased_share is None else f"{f.increased_share:.1f}%"
            verdict = f"{f.verdict} (looks like a clock)" if f.clock else f.verdict
            table.append((f.name, f"{f.changed_share:.1f}%", f"{f.alone_share:.1f}%", share, verdict))
        widths = [max(len(r[i]) for r in table) for i in range(5)]
        for i, r in enumerate(table):
            cells = [r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:4], widths[1:4], strict=True)), r[4]]
            lines.append("  ".join(cells).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append(f"(over {a.content_forwards} forwards whose content changed)")
    else:
        lines.append("no forward whose content changed has its changed fields recorded in this period")
    if a.excluded_fields:
        outside = ", ".join(f"{n} ({k})" for n, k in list(a.excluded_fields.items())[:10])
        lines.append(f"changed outside the selection, in suppressions: {outside}")
    lines += _moves_lines(a)
    tolerances = [f"--tolerance {n}={v}" for n, v in a.tolerance.items()] if a.values_recorded else []
    selection = " ".join([*(f"--exclude {n}" for n in a.exclude), *(f"--include {n}" for n in a.include), *tolerances])
    lines.append("")
    lines.append(
        f"skip rate: had {_show(a.had_rate)} ({_show(a.had_rate_evaluable)} of the evaluable messages); "
        + (
            f"with {selection}: {_show(a.would_rate)} of the evaluable messages"
            if selection
            else "give --exclude/--include/--tolerance for what another selection would have skipped"
        )
    )
    if a.suggestions:
        lines.append("")
        lines.append("suggestions:")
        lines += [f"  - {s}" for s in a.suggestions]
    if a.suggestions or selection:
        lines.append("")
        lines.append(
            "before deploying a changed selection: pubsub-filter plan --config NEW --from CURRENT shows what it "
            "would forward (a narrowing forwards nothing that did not change; see docs, Changing a route's selection)"
        )
    return "\n".join(lines)


def _moves_lines(a: Analysis) -> list[str]:
    """How far numbers move between forwards; or, on a row route, that no values are recorded."""
    if not a.values_recorded:
        said = "no distribution of moves"
        if a.tolerance:
            said += ", and --tolerance cannot be evaluated (the skip rate below leaves it out)"
        return ["", f"numbers: this is a row route, whose records keep no values: {said}"]
    if not a.moves:
        return []
    table = [("number", "forwards", "alone", "p50", "p90", "max", "p50 %")]
    for m in a.moves:
        relative = "-" if m.p50_relative is None else f"{m.p50_relative:g}%"
        table.append((m.name, str(m.forwards), str(m.alone), f"{m.p50:g}", f"{m.p90:g}", f"{m.max:g}", relative))
    widths = [max(len(r[i]) for r in table) for i in range(7)]
    lines = ["", "how far numbers moved between forwards (|new - last forwarded|; alone: the only change):"]
    for i, r in enumerate(table):
        lines.append("  ".join([r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True))]))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _nothing_in_period(args: argparse.Namespace, since: float | None) -> str:
    """What to say when the period holds no decision for the route: the period as written, and
    when the route's decisions are, so the next `--since` is not a guess (a log read from stdin
    cannot be read twice: then only the period)."""
    try:
        parse_duration(args.since)
        period = f"in the last {args.since}"
    except ValueError:
        period = f"since {args.since}"
    said = f"no decisions recorded for route {args.route!r} {period}"
    if since is None or args.log == "-":
        return said
    reader = reader_for(args)
    try:
        lister: RecordsLister = reader  # type: ignore[assignment]
        every = lister.decision_rows(args.route, None)
    except OSError:
        return said
    finally:
        reader.close()
    if not every:
        return f"{said}, and none at all"
    first, last = every[0]["time"], every[-1]["time"]
    return (
        f"{said}: it has {len(every)} decisions from {_stamp(first)} to {_stamp(last)}"
        f" (try --since {time.strftime('%Y-%m-%d', time.gmtime(first))})"
    )


def run(args: argparse.Namespace) -> int:
    """`pubsub-filter tune`: per-field churn and a what-if skip rate for one route."""
    try:
        since = since_of(args.since, time.time())
    except ValueError as exc:
        print(f"pubsub-filter tune: --since: {exc}", file=sys.stderr)
        return 2
    try:
        tolerance = parse_tolerances(args.tolerance)
    except ValueError as exc:
        print(f"pubsub-filter tune: --tolerance: {exc}", file=sys.stderr)
        return 2
    coalesce = None
    if getattr(args, "coalesce", None):
        try:
            coalesce = tune_coalesce.parse_coalesce(args.coalesce)
        except ValueError as exc:
            print(f"pubsub-filter tune: --coalesce: {exc}", file=sys.stderr)
            return 2
    reader = reader_for(args)
    try:
        lister: RecordsLister = reader  # type: ignore[assignment]
        try:
            rows = lister.decision_rows(args.route, since)
        except OSError as exc:
            print(f"pubsub-filter tune: {exc}", file=sys.stderr)
            return 1
    finally:
        reader.close()
    if not rows:
        print(f"pubsub-filter tune: {_nothing_in_period(args, since)}", file=sys.stderr)
        return 1
    shown = render(args.route, analyse(rows, args.exclude, args.include, tolerance=tolerance), args.format)
    if coalesce is not None:  # the what-if for `coalesce` (`pubsub_filter.tools.tune_coalesce`)
        what_if = tune_coalesce.saved(rows, *coalesce)
        if args.format == "json":
            shown = json.dumps({**json.loads(shown), "coalesce": what_if})
        else:
            shown = f"{shown}\n{tune_coalesce.line(what_if)}"
    print(shown)
    return 0
