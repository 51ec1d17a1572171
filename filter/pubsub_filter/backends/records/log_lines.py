"""Skip-rate counts from decision log lines, wherever the lines were collected.

`counts_from_log` accepts, from a file (`.gz` too) or `-` for stdin:

- our own JSON lines (`pubsub_filter.observability.logsetup`): `{"message": "decision", "route": ..., "time": ...}`;
- `gcloud logging read ... --format=json`: one JSON array of LogEntry objects whose
  `jsonPayload` holds those fields and whose `timestamp` is RFC 3339 (Cloud Logging
  moves our `time` there); a log sink's JSON-lines export (one LogEntry per line) too;
- `kubectl logs` / `docker logs` output, where a prefix may come before the JSON
  (`--timestamps`, `--prefix`, `service | `): the object starts at the first `{`; and
  Docker's json-file driver lines (`{"log": "<our line>\\n", ...}`).

Lines that are not decisions (other events, stdlib text, blank lines) are skipped
silently. Lines that mention a decision but cannot be read (truncated, no route, no
time) are counted, and one warning line goes to stderr at the end. Input is read line
by line, so the file can be larger than memory; only the gcloud array is read whole.

`LogLinesReader` is the `RecordsReader` of such a source: its rows are the
`DecisionCount`s every records reader returns, so skip-rate reads logs as it reads tables.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import itertools
import sys
import time
from collections.abc import Iterator
from typing import IO, Any, NamedTuple

import msgspec

from pubsub_filter.core.compare.selection import FORWARDED_LABEL, SELECTION_CHANGED, SUPPRESSED_LABEL
from pubsub_filter.core.compare.tolerance import WITHIN, WITHIN_TOLERANCE
from pubsub_filter.core.ports import Bucket, DecisionCount, DecisionRow

_BUCKET_FORMAT = {"hour": "%Y-%m-%dT%H:00:00Z", "day": "%Y-%m-%d"}


class _Entry(msgspec.Struct):
    """The few fields a decision line (or a LogEntry around one) needs; the rest are skipped."""

    message: Any = None
    route: Any = None
    decision: Any = None
    reason: Any = None
    enforced: Any = True
    time: dt.datetime | float | None = None  # RFC 3339 (decoded by msgspec, in C) or epoch seconds
    timestamp: dt.datetime | None = None  # LogEntry
    jsonPayload: msgspec.Raw = msgspec.Raw()  # LogEntry: our line, as it was written
    log: Any = None  # Docker json-file driver


_decode_entry = msgspec.json.Decoder(_Entry).decode
_decode_raws = msgspec.json.Decoder(list[msgspec.Raw]).decode
_decode = msgspec.json.Decoder().decode


class _Unreadable:
    """What a read of a source could not use: the lines (or gcloud array entries) that looked
    like decisions but could not be read, and why a whole array could not be."""

    def __init__(self) -> None:
        self.unit = "lines"
        self.bad = 0
        self.first_bad: int | None = None
        self.array: str | None = None

    def line(self, where: int) -> None:
        self.bad += 1
        if self.first_bad is None:
            self.first_bad = where


@contextlib.contextmanager
def _open(source: str) -> Iterator[IO[bytes]]:
    if source == "-":
        yield sys.stdin.buffer
        return
    opener: Any = gzip.open if source.endswith(".gz") else open
    with opener(source, "rb") as fh:
        yield fh


def _is_array(first: bytes) -> bool:
    """`[` then `{` or `]` (gcloud's JSON), not `[pod/name/container] {...}` (kubectl --prefix)."""
    if not first.startswith(b"["):
        return False
    rest = first[1:].lstrip()
    return not rest or rest[:1] in (b"{", b"]")


def _object_in(line: bytes) -> bytes | None:
    """The object a line holds from its first `{` (after any prefix), if the line mentions a decision."""
    brace = line.find(b"{")
    return line[brace:] if b"decision" in line and brace >= 0 else None


class _Decided(NamedTuple):
    """One decision line read: its fields, its time (epoch seconds), and the line's JSON object as written."""

    entry: _Entry
    time: float
    raw: Any


def _decision_in(raw: Any, where: int, unreadable: _Unreadable) -> _Decided | None:
    """The decision line in one JSON object (ours, a LogEntry around one, Docker's wrapper) and
    its time; None when it holds none, and for a decision that cannot be read, which is noted."""
    try:
        entry = _decode_entry(raw)
        stamp = entry.time
        if entry.jsonPayload and bytes(entry.jsonPayload) != b"null":  # a Cloud Logging LogEntry
            raw, outer = entry.jsonPayload, entry.timestamp
            entry = _decode_entry(raw)
            stamp = outer if outer is not None else entry.time  # Cloud Logging moves our `time` to `timestamp`
        elif entry.message is None and isinstance(entry.log, str):  # Docker's json-file wrapper
            # msgspec never decodes a lone surrogate; should one come, surrogatepass makes it a bad line, not a crash
            raw = _object_in(entry.log.encode("utf-8", "surrogatepass"))
            if raw is None:
                return None
            entry = _decode_entry(raw)
            stamp = entry.time
    except (msgspec.DecodeError, msgspec.ValidationError):
        unreadable.line(where)
        return None
    if entry.message != "decision":
        return None
    route, decision, enforced = entry.route, entry.decision, entry.enforced
    if stamp is None or not isinstance(route, str) or not isinstance(decision, str) or not isinstance(enforced, bool):
        unreadable.line(where)
        return None
    if isinstance(stamp, dt.datetime):
        t = (stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=dt.UTC)).timestamp()
    else:
        t = float(stamp)
    return _Decided(entry, t, raw)


def _decisions(source: str, unreadable: _Unreadable) -> Iterator[_Decided]:
    """Every decision line in `source` (a path, `.gz` too, or `-`), in the order read. Read
    line by line, so the file can be larger than memory; only the gcloud array is read whole."""
    with _open(source) as fh:
        first, lineno = b"", 0
        for first in fh:
            lineno += 1
            first = first.removeprefix(b"\xef\xbb\xbf").lstrip()
            if first:
                break
        if _is_array(first):
            unreadable.unit = "entries"
            try:
                entries = _decode_raws(first + fh.read())
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                unreadable.array = str(exc)
                return
            numbered: Iterator[tuple[int, Any]] = enumerate(entries, 1)
        else:
            numbered = enumerate(map(_object_in, itertools.chain([first], fh)), lineno)
        for n, raw in numbered:
            found = None if raw is None else _decision_in(raw, n, unreadable)
            if found is not None:
                yield found


def _warn(source: str, unreadable: _Unreadable) -> None:
    if unreadable.array is not None:
        print(f"warning: {source} looks like a JSON array but cannot be read: {unreadable.array}", file=sys.stderr)
    if unreadable.bad:
        name = "stdin" if source == "-" else source
        many, one = unreadable.unit, unreadable.unit[:-1]
        print(
            f"warning: {unreadable.bad} {many if unreadable.bad > 1 else one} in {name} looked like decisions but "
            f"could not be read, so {'they were' if unreadable.bad > 1 else 'it was'} not counted "
            f"(first: {one} {unreadable.first_bad})",
            file=sys.stderr,
        )


#: A forward and a suppression under a changed selection, as `skip-rate` counts them.
_RESELECTED = {"forwarded": FORWARDED_LABEL, "suppressed": SUPPRESSED_LABEL}


def counts_from_log(source: str, since: float | None, by: str) -> list[DecisionCount]:
    """Decisions counted per (route, bucket, decision, enforced) from log lines in `source`.

    `source` is a path or `-` (stdin); `since` is epoch seconds (None: everything);
    `by` is route, hour or day. Raises OSError when the file cannot be read.
    """
    if by not in ("route", "hour", "day"):
        raise ValueError(f"by must be route, hour or day, not {by!r}")
    counts: dict[tuple[str, str | None, str, bool], int] = {}
    labels: dict[int, str] = {}  # by hour since the epoch: a label is formatted once an hour
    unreadable = _Unreadable()
    for entry, t, _ in _decisions(source, unreadable):
        if since is not None and t < since:
            continue
        decision = entry.decision
        if decision == "suppressed" and isinstance(entry.reason, str) and entry.reason.startswith(WITHIN):
            decision = WITHIN_TOLERANCE  # counted under its own name (`skip-rate`)
        elif decision in _RESELECTED and isinstance(entry.reason, str) and entry.reason.startswith(SELECTION_CHANGED):
            decision = _RESELECTED[decision]  # decided under a changed selection: counted apart
        label = None
        if by != "route":
            hour = int(t // 3600)
            label = labels.get(hour)
            if label is None:
                label = labels[hour] = time.strftime(_BUCKET_FORMAT[by], time.gmtime(hour * 3600))
        k = (entry.route, label, decision, entry.enforced)
        counts[k] = counts.get(k, 0) + 1
    _warn(source, unreadable)
    return [
        {"route": r, "bucket": b, "decision": d, "enforced": e, "n": n}
        for (r, b, d, e), n in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", *kv[0][2:]))
    ]


def rows_from_log(source: str, route: str, since: float | None) -> list[DecisionRow]:
    """One route's decisions from log lines in `source` (the sources `counts_from_log` reads),
    in time order; lines that cannot be read are skipped (`skip-rate` counts and reports them)."""
    found: list[DecisionRow] = []
    for entry, t, raw in _decisions(source, _Unreadable()):
        if entry.route != route or (since is not None and t < since):
            continue
        line = _decode(raw)
        found.append(
            {
                "time": t,
                "decision": entry.decision,
                "enforced": entry.enforced,
                "key": line.get("key"),
                "reason": line.get("reason"),
                "fingerprint": line.get("fingerprint"),
                "previous_fingerprint": line.get("previous_fingerprint"),
                "extra": line,  # the record's `extra` keys are spread into the line
            }
        )
    found.sort(key=lambda r: r["time"])
    return found


class LogLinesReader:
    """The `RecordsReader` of decision log lines in a file (`.gz` too) or `-` (stdin), read
    anew on every call."""

    def __init__(self, source: str) -> None:
        self.source = source

    def decision_counts(self, since: float | None, by: Bucket) -> list[DecisionCount]:
        return counts_from_log(self.source, since, by)

    def decision_rows(self, route: str, since: float | None) -> list[DecisionRow]:
        return rows_from_log(self.source, route, since)

    def close(self) -> None:
        pass  # the file is opened and closed by each read
