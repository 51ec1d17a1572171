"""Skip rate: how much the filter held back, per route and per hour or day.

skip rate = (suppressed + duplicate + stale + noise_only) / decided, where decided counts
every message that was acked (forwarded, fail_open, and those held back). Contended
and failed messages come back and are counted when they are finally decided; rejected
ones were never understood. Only enforced decisions skip anything: a shadow route
forwards everything, so its `skip_rate` is 0 and its `would_skip` is the skip rate
enforce mode would have had. A route switched from shadow to enforce inside one bucket
is `mixed` and shows both.

The counts come from the records backend in the config (SQLite or BigQuery) or, with
`--log`, from decision log lines (`filter.backends.records.log_lines`): every source returns the same
`(route, bucket, decision, enforced, n)` rows, so the numbers agree wherever they come from.

Requests to `/push/NAME` for a NAME that is not a route (scanners, typos) are recorded as
rejected decisions under that name. When the config is at hand, such names (not in the
config, nothing but rejections) are left out of the table and counted on one stderr line.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import io
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import msgspec

from filter.core.config import CONFIG_ENV, DEFAULT_CONFIG, ConfigError, load
from filter.core.model import Decision
from filter.core.times import parse_instant

#: every decision, in the model's order: one column each
DECISIONS = tuple(str(d) for d in Decision)
#: held back: acked and not published (noise_only is a suppression the audit sample looked into)
SKIPPED = ("suppressed", "duplicate", "stale", "noise_only")
#: acked: published (forwarded, fail_open) or held back
DECIDED = ("forwarded", "fail_open", *SKIPPED)
CHART_HINT = "pip install 'pubsub-filter[chart]'"


@dataclass
class SkipRow:
    route: str
    bucket: str | None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DECISIONS, 0))
    shadow: bool = False  # some decisions were made in shadow mode (enforced = false)
    enforced: bool = False  # some decisions were made in enforce mode
    enforced_skipped: int = 0  # suppressed + duplicate + stale actually held back

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def decided(self) -> int:
        return sum(self.counts[d] for d in DECIDED)

    @property
    def mode(self) -> str:
        if self.shadow:
            return "mixed" if self.enforced else "shadow"
        return "enforce"

    @property
    def skip_rate(self) -> float | None:
        """Percent of decided messages actually held back (enforced decisions only)."""
        decided = self.decided
        return None if decided == 0 else 100.0 * self.enforced_skipped / decided

    @property
    def would_skip(self) -> float | None:
        """Percent enforce mode would have held back; None unless some decisions were shadow."""
        decided = self.decided
        if not self.shadow or decided == 0:
            return None
        return 100.0 * sum(self.counts[d] for d in SKIPPED) / decided

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"route": self.route, "bucket": self.bucket, "mode": self.mode, "total": self.total}
        out.update(self.counts)
        rate, would = self.skip_rate, self.would_skip
        out["skip_rate"] = None if rate is None else round(rate, 2)
        out["would_skip"] = None if would is None else round(would, 2)
        return out


def summarize(counts: Iterable[dict[str, Any]]) -> list[SkipRow]:
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


# --- chart --------------------------------------------------------------------------


class ChartUnavailable(Exception):
    """matplotlib (the `chart` extra) is not installed."""


def _bucket_time(bucket: str) -> dt.datetime:
    if len(bucket) == 10:  # a day
        return dt.datetime.strptime(bucket, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    return dt.datetime.strptime(bucket, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ChartUnavailable(f"--chart needs matplotlib: {CHART_HINT}") from exc
    return Figure


#: one bucket's width: the x axis reaches half a bucket beyond the first and last point
_BUCKET_WIDTH = {"hour": dt.timedelta(hours=1), "day": dt.timedelta(days=1)}


def figure(rows: list[SkipRow], by: str = "hour") -> Any:
    """The skip rate per route over time: solid lines for what was skipped, dashed for
    what shadow routes would have skipped. The x axis spans the data, whatever its span."""
    figure_class = _figure_class()
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    fig = figure_class(figsize=(10, 5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    routes = sorted({r.route for r in rows if r.bucket is not None})
    times: list[dt.datetime] = []
    for i, route in enumerate(routes):
        color = f"C{i % 10}"
        mine = [r for r in rows if r.route == route and r.bucket is not None]
        times.extend(_bucket_time(r.bucket) for r in mine if r.bucket)
        actual = [(_bucket_time(r.bucket), r.skip_rate) for r in mine if r.bucket and r.skip_rate is not None]
        if any(r.enforced for r in mine):
            ax.plot([t for t, _ in actual], [v for _, v in actual], "o-", color=color, label=route, markersize=3)
        would = [(_bucket_time(r.bucket), r.would_skip) for r in mine if r.bucket and r.would_skip is not None]
        if would:
            ax.plot(
                [t for t, _ in would],
                [v for _, v in would],
                "o--",
                color=color,
                label=f"{route} (shadow: would skip)",
                markersize=3,
            )
    if times:
        # matplotlib's default date limits for one point (or a few) span years
        half = _BUCKET_WIDTH.get(by, _BUCKET_WIDTH["hour"]) / 2
        ax.set_xlim(min(times) - half, max(times) + half)
        locator = AutoDateLocator()  # type: ignore[no-untyped-call]
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    ax.set_ylim(0, 101)
    ax.set_ylabel("skip rate (%)")
    ax.set_xlabel(f"UTC {by}")
    ax.set_title(f"pubsub-filter skip rate per route, by {by}")
    ax.grid(True, alpha=0.3)
    if routes:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    else:
        ax.text(0.5, 0.5, "no decisions recorded in this period", ha="center", va="center", transform=ax.transAxes)
    return fig


def chart(rows: list[SkipRow], path: str, by: str = "hour") -> None:
    """Draw `figure(rows, by)` to a PNG at `path`."""
    figure(rows, by).savefig(path, format="png")


# --- the command --------------------------------------------------------------------


Bucket = Literal["route", "hour", "day"]


def _bucket(by: str) -> Bucket:
    if by not in ("route", "hour", "day"):
        raise ValueError(f"by must be route, hour or day, not {by!r}")
    return cast(Bucket, by)


def counts_for(args: argparse.Namespace, since: float | None, by: str | None = None) -> list[dict[str, Any]]:
    """(route, bucket, decision, enforced, n) rows from the log lines or the configured records backend."""
    by = _bucket(by or args.by)
    if args.log:
        from filter.backends.records.log_lines import counts_from_log

        return counts_from_log(args.log, since, by)
    cfg = load(args.config)
    if cfg.records.backend == "sqlite":
        from filter.backends.records.sqlite import decision_counts

        return decision_counts(cfg.records.path, since, by)
    from filter.backends.records.bigquery import decision_counts as bq_counts
    from filter.backends.records.bigquery import make_client
    from filter.runtime.operational import BIGQUERY, require
    from filter.runtime.wiring import project_of

    require(BIGQUERY)  # the client would retry an unreachable endpoint for minutes

    client = make_client(project_of(cfg, cfg.records.project), cfg.records.location)
    table = f"{client.project}.{cfg.records.dataset}.{cfg.records.table}"
    return asyncio.run(bq_counts(client, since, by, table=table))


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
            _figure_class()
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
    try:
        while True:
            try:
                rows = summarize(counts_for(args, since_of(args.since, time.time()), by))
            except OSError as exc:
                print(f"pubsub-filter skip-rate: {exc}", file=sys.stderr)
                return 1
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
