"""Times, one grammar for every surface: RFC 3339 stamps, durations, and "since when" instants.

Push envelopes, pulled messages, the config's durations, replay's `--since`/`--until` and
skip-rate's `--since` all parse here, so a stamp or a duration means the same everywhere.
"""

from __future__ import annotations

import calendar
import re
import time
from typing import Any

_RFC3339 = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|z|[+-]\d\d:\d\d)$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.ASCII)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_DATE = re.compile(r"^\d{4}-\d\d-\d\d$", re.ASCII)


def format_time(ts: float) -> str:
    """Epoch seconds → RFC 3339 UTC with microseconds, rounded (the inverse of `parse_time`).

    Rounded, not truncated: .123 is stored as .12299999..., and gmtime, unlike datetime, takes
    any year `parse_time` can produce (a 9999-12-31 stamp with a negative offset is year 10000).
    """
    global _last_second
    seconds, micros = divmod(round(ts * 1_000_000), 1_000_000)
    last = _last_second  # one tuple, replaced whole: safe to share between threads
    if last[0] != seconds:
        # every log line is stamped, and gmtime + strftime were most of a decision line's cost
        last = _last_second = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    return f"{last[1]}.{micros:06d}Z"


_last_second: tuple[int, str] = (0, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(0)))


def parse_time(text: str) -> float:
    """RFC 3339 with any number of fractional digits (Pub/Sub sends up to nine) → epoch seconds."""
    m = _RFC3339.match(text)
    if not m:
        raise ValueError(f"{text!r} is not an RFC 3339 time")
    y, mo, d, h, mi, s, frac, tz = m.groups()
    seconds: float = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0))
    if frac:
        seconds += int(frac[:9].ljust(9, "0")) / 1e9
    if tz not in ("Z", "z"):
        sign = 1 if tz[0] == "+" else -1
        seconds -= sign * (int(tz[1:3]) * 3600 + int(tz[4:6]) * 60)
    return float(seconds)


def parse_duration(value: Any) -> float:
    """`90`, `90s`, `15m`, `24h`, `7d`, `500ms` → seconds."""
    seconds = _seconds(value)
    if not 0 < seconds < 10 * 365 * 86400:  # also rejects nan and inf
        raise ValueError("a duration must be positive and under ten years")
    return seconds


def parse_wait(value: Any) -> float:
    """A duration as `parse_duration` reads it, or none at all: `0`, `0s`, `0ms` → 0.0."""
    seconds = _seconds(value)
    if not 0 <= seconds < 10 * 365 * 86400:  # also rejects nan and inf
        raise ValueError("a wait must be 0 or positive, and under ten years")
    return seconds


def _seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like 90s, 15m, 24h, 7d")
    try:
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            m = _DURATION.match(str(value))
            if not m:
                raise ValueError(f"{value!r} is not a duration: write e.g. 90s, 15m, 24h or 7d")
            seconds = float(m.group(1)) * _UNITS[m.group(2)]
    except OverflowError:
        raise ValueError("that duration is too large") from None
    return seconds


def parse_instant(text: str, now: float) -> float:
    """A point in time as an operator writes it → epoch seconds: a duration back from `now`
    (`24h`, `90m`, `7d`), a date (`2026-01-10`, its midnight UTC) or an RFC 3339 time.

    A date or time that names no real day or time (`2026-01-45`, `24:00:00`) is an error saying
    which part is out of range, not the day it would overflow into: an operator's typo must not
    quietly move the period read."""
    text = text.strip()
    stamp = f"{text}T00:00:00Z" if _DATE.match(text) else text
    written = _RFC3339.match(stamp)
    if written:
        _refuse_overflow(text, written)
        return parse_time(stamp)
    try:
        return now - parse_duration(text)
    except ValueError:
        raise ValueError(
            f"{text!r}: write a duration (24h, 90m, 7d), a date (2026-01-10) or an RFC 3339 time (2026-01-10T17:00:00Z)"
        ) from None


def _refuse_overflow(text: str, written: re.Match[str]) -> None:
    """`parse_time` (the per-message path, kept lean) normalises an out-of-range field into the
    next one, as `calendar.timegm` does; an operator's instant is checked field by field first."""
    import datetime  # only here: the message path never pays for the import

    y, mo, d, h, mi, s = (int(part) for part in written.groups()[:6])
    try:
        datetime.datetime(y, mo, d, h, mi, min(s, 59))  # 60: a leap second, as RFC 3339 allows
    except ValueError as exc:
        raise ValueError(f"{text!r} is no such date or time: {exc}") from None
