"""Skip rate: how much the filter held back, per route and per hour or day.

skip rate = (suppressed + duplicate + stale) / decided, where decided counts every
message that was acked (forwarded, suppressed, duplicate, stale, fail_open). Contended
and failed messages come back and are counted when they are finally decided; rejected
ones were never understood. Shadow routes forward everything: their `would_skip` is the
skip rate enforce mode would have had.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .config import load, parse_duration

DECISIONS = ("forwarded", "suppressed", "duplicate", "contended", "stale", "fail_open", "rejected", "failed")
SKIPPED = ("suppressed", "duplicate", "stale")
DECIDED = ("forwarded", "suppressed", "duplicate", "stale", "fail_open")


@dataclass
class SkipRow:
    route: str
    bucket: str | None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DECISIONS, 0))
    shadow: bool = False

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def rate(self) -> float | None:
        decided = sum(self.counts[d] for d in DECIDED)
        return None if decided == 0 else 100.0 * sum(self.counts[d] for d in SKIPPED) / decided

    def as_dict(self) -> dict[str, Any]:
        rate = self.rate
        out: dict[str, Any] = {"route": self.route, "bucket": self.bucket, "total": self.total}
        out.update(self.counts)
        out["skip_rate"] = None if rate is None else round(0.0 if self.shadow else rate, 2)
        out["would_skip"] = round(rate, 2) if (self.shadow and rate is not None) else None
        return out


def summarize(counts: Iterable[dict[str, Any]]) -> list[SkipRow]:
    """Fold (route, bucket, decision, enforced, n) rows into one row per (route, bucket)."""
    rows: dict[tuple[str, str | None], SkipRow] = {}
    for c in counts:
        row = rows.setdefault((c["route"], c["bucket"]), SkipRow(c["route"], c["bucket"]))
        decision = str(c["decision"])
        row.counts[decision] = row.counts.get(decision, 0) + int(c["n"])
        if not c["enforced"] and decision != "rejected":
            row.shadow = True
    return sorted(rows.values(), key=lambda r: (r.route, r.bucket or ""))


def render(rows: list[SkipRow], fmt: str) -> str:
    dicts = [r.as_dict() for r in rows]
    if fmt == "json":
        return msgspec.json.encode(dicts).decode()
    columns = ["route", "bucket", "total", *DECISIONS, "skip_rate", "would_skip"]
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(dicts)
        return buf.getvalue()
    if not dicts:
        return "no decisions recorded in this period"
    show = [c for c in columns if c != "bucket" or any(d["bucket"] for d in dicts)]
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
    lines = []
    for i, r in enumerate(table):
        lines.append(
            "  ".join(r[c].ljust(widths[c]) if c in ("route", "bucket") else r[c].rjust(widths[c]) for c in show)
        )
        if i == 0:
            lines.append("  ".join("-" * widths[c] for c in show))
    return "\n".join(lines)


def counts_for(args: argparse.Namespace, since: float | None) -> list[dict[str, Any]]:
    """(route, bucket, decision, enforced, n) rows from the log lines or the configured records backend."""
    if args.log:
        from .decision_log import counts_from_log

        return counts_from_log(args.log, since, args.by)
    cfg = load(args.config)
    if cfg.records.backend == "sqlite":
        from .records.sqlite import decision_counts

        return decision_counts(cfg.records.path, since, args.by)
    from .records.bigquery import decision_counts as bq_counts
    from .records.bigquery import make_client
    from .wiring import project_of

    client = make_client(project_of(cfg, cfg.records.project), cfg.records.location)
    table = f"{client.project}.{cfg.records.dataset}.{cfg.records.table}"
    return asyncio.run(bq_counts(client, since, args.by, table=table))


def run(args: argparse.Namespace) -> int:
    """`pubsub-filter skip-rate`: print (or keep refreshing) the table."""
    since = time.time() - parse_duration(args.since) if args.since else None
    while True:
        output = render(summarize(counts_for(args, since)), args.format)
        if args.watch:
            print("\033[2J\033[H" + time.strftime("%H:%M:%S") + f"  (every {args.watch:g}s, Ctrl-C to stop)\n")
        print(output)
        if not args.watch:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
        since = time.time() - parse_duration(args.since) if args.since else None
