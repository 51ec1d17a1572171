"""Skip rate: how much the filter held back, per route and per hour or day.

skip rate = (suppressed + duplicate + stale + noise_only) / decided, where decided counts
every message that was acked (forwarded, fail_open, and those held back). Contended
and failed messages come back and are counted when they are finally decided; rejected
ones were never understood. Only enforced decisions skip anything: a shadow route
forwards everything, so its `skip_rate` is 0 and its `would_skip` is the skip rate
enforce mode would have had. A route switched from shadow to enforce inside one bucket
is `mixed` and shows both.

The counts come from the records backend in the config (SQLite or BigQuery) or, with
`--log`, from decision log lines (`filter.decision_log`): every source returns the same
`(route, bucket, decision, enforced, n)` rows, so the numbers agree wherever they come from.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import io
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import msgspec

from .config import load, parse_duration
from .envelope import parse_time
from .model import Decision

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
        return buf.getvalue()
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


def chart(rows: list[SkipRow], path: str, by: str = "hour") -> None:
    """A PNG of the skip rate per route over time: solid lines for what was skipped,
    dashed for what shadow routes would have skipped."""
    figure_class = _figure_class()
    fig = figure_class(figsize=(10, 5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    routes = sorted({r.route for r in rows if r.bucket is not None})
    for i, route in enumerate(routes):
        color = f"C{i % 10}"
        mine = [r for r in rows if r.route == route and r.bucket is not None]
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
    ax.set_ylim(0, 101)
    ax.set_ylabel("skip rate (%)")
    ax.set_xlabel(f"UTC {by}")
    ax.set_title(f"pubsub-filter skip rate per route, by {by}")
    ax.grid(True, alpha=0.3)
    if routes:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    else:
        ax.text(0.5, 0.5, "no decisions recorded in this period", ha="center", va="center", transform=ax.transAxes)
    fig.autofmt_xdate()
    fig.savefig(path, format="png")


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
        from .decision_log import counts_from_log

        return counts_from_log(args.log, since, by)
    cfg = load(args.config)
    if cfg.records.backend == "sqlite":
        from .records.sqlite import decision_counts

        return decision_counts(cfg.records.path, since, by)
    from .records.bigquery import decision_counts as bq_counts
    from .records.bigquery import make_client
    from .wiring import project_of

    client = make_client(project_of(cfg, cfg.records.project), cfg.records.location)
    table = f"{client.project}.{cfg.records.dataset}.{cfg.records.table}"
    return asyncio.run(bq_counts(client, since, by, table=table))


def since_of(text: str | None, now: float) -> float | None:
    """`--since`: a duration back from now (`24h`, `7d`) or an RFC 3339 time."""
    if not text:
        return None
    if "-" in text:
        return parse_time(f"{text}T00:00:00Z" if len(text) == 10 else text)
    return now - parse_duration(text)


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
            frame = render(rows, args.format)
            if chart_path:
                chart(rows, chart_path, by)
            if watch is not None:
                head = f"{time.strftime('%H:%M:%S')}  every {watch:g}s, Ctrl-C to stop\n\n"
                frame = ("\033[H\033[2J" if clear else "") + head + frame
            sys.stdout.write(frame + "\n")
            sys.stdout.flush()
            if chart_path and not watch:
                print(f"chart written to {chart_path}", file=sys.stderr)
            if watch is None:
                return 0
            time.sleep(watch)
    except KeyboardInterrupt:
        if watch is None:
            raise  # interrupted before the one answer: not a success (the CLI exits 130)
        return 0
