"""`skip-rate --chart`: the skip rate per route over time, drawn to a PNG with matplotlib
(the optional `chart` extra, imported only when a chart is asked for)."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from pubsub_filter.core.errors import FilterError

if TYPE_CHECKING:  # the rows' type only
    from pubsub_filter.tools.skiprows import SkipRow

#: the optional dependency group in pyproject.toml that holds matplotlib (tests/unit/test_skiprate.py
#: checks that it exists there)
CHART_EXTRA = "chart"
CHART_HINT = f"pip install matplotlib (the '{CHART_EXTRA}' extra: pip install 'pubsub-filter[{CHART_EXTRA}]')"


class ChartUnavailable(FilterError):
    """matplotlib (the `chart` extra) is not installed."""


def _bucket_time(bucket: str) -> dt.datetime:
    if len(bucket) == 10:  # a day
        return dt.datetime.strptime(bucket, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    return dt.datetime.strptime(bucket, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def figure_class() -> Any:
    """matplotlib's Figure; raises `ChartUnavailable` naming what to install when it is missing."""
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
    figure_class_ = figure_class()
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    fig = figure_class_(figsize=(10, 5), dpi=100, layout="constrained")
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
