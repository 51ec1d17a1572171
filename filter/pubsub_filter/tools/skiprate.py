"""Skip rate: how much the filter held back, per route and per hour or day.

skip rate = (suppressed + within_tolerance + selection_suppressed + duplicate + stale + noise_only + superseded)
/ decided,
where decided counts every message that was acked (forwarded, selection_forwarded, fail_open, and those held
back); the selection_* columns are decisions under a changed selection (`core.compare.selection`). Contended
and failed messages come back and are counted when they are finally decided; rejected
ones were never understood. Only enforced decisions skip anything: a shadow route
forwards everything, so its `skip_rate` is 0 and its `would_skip` is the skip rate
enforce mode would have had. A route switched from shadow to enforce inside one bucket
is `mixed` and shows both.

The counts come from a `RecordsReader` (`pubsub_filter.core.ports`): the records backend in the
config (SQLite or BigQuery) or, with `--log`, decision log lines. Every reader returns the
same `DecisionCount` rows, so the numbers agree wherever they come from. This module turns
them into one row per route (and bucket) and renders the table, JSON or CSV; the chart is
`pubsub_filter.tools.skiprate_chart`; both read the rows of `pubsub_filter.tools.skiprows`.

Requests to `/push/NAME` for a NAME that is not a route (scanners, typos) are recorded as
rejected decisions under that name. When the config is at hand, such names (not in the
config, nothing but rejections) are left out of the table and counted on one stderr line.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import msgspec

from pubsub_filter.core.config.schema import CONFIG_ENV, DEFAULT_CONFIG, ConfigError, load
from pubsub_filter.core.ports import Bucket, RecordsReader
from pubsub_filter.core.times import parse_instant
from pubsub_filter.tools.skiprate_chart import ChartUnavailable, chart, figure_class
from pubsub_filter.tools.skiprows import DECISIONS, OCCASIONAL, SKIPPED, SkipRow


def summarize(counts: Iterable[Mapping[str, Any]]) -> list[SkipRow]:
    """Fold (route, bucket, decision, enforced, n) rows into one row per (route, bucket)."""
    rows: dict[tuple[str, str | None], SkipRow] = {}
    for c in counts:
        row = rows.get((c["route"], c["bucket"]))
        if row is None:
            row = rows[(c["route"], c["bucket"])] = SkipRow(c["route"], c["bucket"])
        decision = str(c["decision"])
        n = int(c["n"])
        row.counts[decision] = row.counts.get(decision, 0) + n
        if decision == "rejected":
            continue  # rejected before the route's mode applied: says nothing about it
        if c["enforced"]:
            row.enforced = True
            if decision in SKIPPED:
                row.enforced_skipped += n
        else:
            row.shadow = True
    return sorted(rows.values(), key=lambda r: (r.route, r.bucket or ""))


def render(rows: list[SkipRow], fmt: str) -> str:
    dicts = [r.as_dict() for r in rows]
    if fmt == "json":
        return msgspec.json.encode(dicts).decode()
    columns = ["route", "bucket", "mode", "total", *DECISIONS, "skip_rate", "would_skip"]
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(dicts)
        return buf.getvalue().removesuffix("\n")  # the caller ends the frame with its newline
    if not dicts:
        return "no decisions recorded in this period"
    show = [c for c in columns if c != "bucket" or any(d["bucket"] for d in dicts)]
    show = [c for c in show if c != "mode" or any(d["mode"] != "enforce" for d in dicts)]
    show = [c for c in show if c != "would_skip" or any(d["would_skip"] is not None for d in dicts)]
    # a route without a tolerance never has one: such a column shows where some route does
    show = [c for c in show if c not in OCCASIONAL or any(d[c] for d in dicts)]
    header = {c: c.replace("_", " ") for c in show}

    def cell(d: dict[str, Any], c: str) -> str:
        v = d.get(c)
        if v is None:
            return "-"
        if c in ("skip_rate", "would_skip"):
            return f"{v:.1f}%"
        return str(v)

    table = [header] + [{c: cell(d, c) for c in show} for d in dicts]
    widths = {c: max(len(r[c]) for r in table) for c in show}
    left = ("route", "bucket", "mode")
    lines = []
    for i, r in enumerate(table):
        lines.append("  ".join(r[c].ljust(widths[c]) if c in left else r[c].rjust(widths[c]) for c in show).rstrip())
        if i == 0:
            lines.append("  ".join("-" * widths[c] for c in show))
    return "\n".join(lines)


# --- the command --------------------------------------------------------------------


def _bucket(by: str) -> Bucket:
    if by not in ("route", "hour", "day"):
        raise ValueError(f"by must be route, hour or day, not {by!r}")
    return cast(Bucket, by)


def reader_for(args: argparse.Namespace) -> RecordsReader:
    """The log lines of `--log`, else the records backend of the config."""
    # imported here: the wiring module loads the engine and telemetry, which reading counts never needs
    from pubsub_filter.runtime.wiring import make_reader

    return make_reader(None if args.log else load(args.config), args.log)


def split_probes(rows: list[SkipRow], routes: set[str]) -> tuple[list[SkipRow], dict[str, int]]:
    """Set apart requests to paths that are not routes: a route missing from the config
    whose every decision is `rejected` (404 unknown route) is someone probing `/push/NAME`,
    not a route of the filter. A route removed from the config keeps its history: it has
    other decisions."""
    kept: list[SkipRow] = []
    probes: dict[str, int] = {}
    for row in rows:
        if row.route not in routes and row.total == row.counts["rejected"]:
            probes[row.route] = probes.get(row.route, 0) + row.total
        else:
            kept.append(row)
    return kept, probes


def probes_note(probes: dict[str, int]) -> str:
    n = sum(probes.values())
    names = ", ".join(f"/push/{name} ({count})" for name, count in sorted(probes.items(), key=lambda kv: -kv[1])[:5])
    more = f" and {len(probes) - 5} more" if len(probes) > 5 else ""
    return (
        f"left out: {n} request{'s' if n != 1 else ''} to {len(probes)} "
        f"path{'s' if len(probes) != 1 else ''} that {'are' if len(probes) != 1 else 'is'} "
        f"not a route in the config: {names}{more}"
    )


def route_names(args: argparse.Namespace) -> set[str] | None:
    """The config's routes, to tell probes from routes; None when no config is at hand
    (`--log` without `--config`, `$PUBSUB_FILTER_CONFIG` or a readable ./filter.yaml)."""
    if args.log and not (args.config or os.environ.get(CONFIG_ENV)):
        if not Path(DEFAULT_CONFIG).is_file():
            return None
        try:
            return {r.name for r in load(DEFAULT_CONFIG).routes}
        except ConfigError:
            return None  # a stray ./filter.yaml must not stop reading a log
    return {r.name for r in load(args.config).routes}


def since_of(text: str | None, now: float) -> float | None:
    """`--since`: a duration back from now (`24h`, `7d`), a date or an RFC 3339 time."""
    return parse_instant(text, now) if text else None


def run(args: argparse.Namespace) -> int:
    """`pubsub-filter skip-rate`: print the table (and draw the chart); with --watch, keep refreshing."""
    chart_path: str | None = getattr(args, "chart", None)
    watch: float | None = args.watch
    by = args.by
    if chart_path:
        try:
            figure_class()
        except ChartUnavailable as exc:
            print(f"pubsub-filter skip-rate: {exc}", file=sys.stderr)
            return 2
        if by == "route":
            by = "hour"  # a chart needs time on its x axis
    if watch is not None and watch <= 0:
        print("pubsub-filter skip-rate: --watch needs a positive number of seconds", file=sys.stderr)
        return 2
    if watch is not None and args.log == "-":
        # stdin is read to its end by the first refresh: every later one would show nothing
        print(
            "pubsub-filter skip-rate: --watch cannot re-read stdin (--log -): give --log a file, or drop --watch",
            file=sys.stderr,
        )
        return 2
    try:
        since_of(args.since, time.time())
    except ValueError as exc:
        print(f"pubsub-filter skip-rate: --since: {exc}", file=sys.stderr)
        return 2
    clear = watch is not None and sys.stdout.isatty()
    reader = reader_for(args)
    try:
        while True:
            try:
                counts = reader.decision_counts(since_of(args.since, time.time()), _bucket(by))
            except OSError as exc:
                print(f"pubsub-filter skip-rate: {exc}", file=sys.stderr)
                return 1
            rows = summarize(counts)
            routes = route_names(args)
            probes: dict[str, int] = {}
            if routes is not None:
                rows, probes = split_probes(rows, routes)
            frame = render(rows, args.format)
            if chart_path:
                chart(rows, chart_path, by)
            if watch is not None:
                head = f"{time.strftime('%H:%M:%S')}  every {watch:g}s, Ctrl-C to stop\n\n"
                frame = ("\033[H\033[2J" if clear else "") + head + frame
            sys.stdout.write(frame + "\n")
            sys.stdout.flush()
            if probes:
                print(f"pubsub-filter skip-rate: {probes_note(probes)}", file=sys.stderr)
            if chart_path and not watch:
                print(f"chart written to {chart_path}", file=sys.stderr)
            if watch is None:
                return 0
            time.sleep(watch)
    except KeyboardInterrupt:
        if watch is None:
            raise  # interrupted before the one answer: not a success (the CLI exits 130)
        return 0
    finally:
        reader.close()
