"""Skip-rate counts from decision log lines, wherever the lines were collected.

`counts_from_log` accepts, from a file (`.gz` too) or `-` for stdin:

- our own JSON lines (`filter.observability.logsetup`): `{"message": "decision", "route": ..., "time": ...}`;
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
from collections.abc import Iterable, Iterator
from typing import IO, Any

import msgspec

from filter.core.ports import Bucket, DecisionCount, DecisionRow
from filter.core.tolerance import WITHIN, WITHIN_TOLERANCE

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
    jsonPayload: _Entry | None = None  # LogEntry
    log: Any = None  # Docker json-file driver


_decode_entry = msgspec.json.Decoder(_Entry).decode
_decode_entries = msgspec.json.Decoder(list[_Entry]).decode


class _Counter:
    def __init__(self, since: float | None, by: str) -> None:
        if by not in ("route", "hour", "day"):
            raise ValueError(f"by must be route, hour or day, not {by!r}")
        self.since = since
        self.by = by
        self.counts: dict[tuple[str, str | None, str, bool], int] = {}
        self.bad = 0
        self.first_bad: int | None = None
        self._labels: dict[int, str] = {}

    def bad_line(self, where: int) -> None:
        self.bad += 1
        if self.first_bad is None:
            self.first_bad = where

    def label(self, t: float) -> str | None:
        if self.by == "route":
            return None
        hour = int(t // 3600)
        label = self._labels.get(hour)
        if label is None:
            label = self._labels[hour] = time.strftime(_BUCKET_FORMAT[self.by], time.gmtime(hour * 3600))
        return label

    def entry_in(self, line: bytes, where: int) -> _Entry | None:
        """The object a line holds from its first `{` (after any prefix), if the line mentions
        a decision; None otherwise, and for a broken one, which is noted."""
        if b"decision" not in line:
            return None
        brace = line.find(b"{")
        if brace < 0:
            return None
        try:
            return _decode_entry(line[brace:])
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.bad_line(where)
            return None

    def add(self, entry: _Entry, where: int) -> None:
        """Count one decoded object if it is a decision; note it if it is a broken one."""
        if entry.jsonPayload is not None:  # a Cloud Logging LogEntry
            stamp = entry.timestamp if entry.timestamp is not None else entry.jsonPayload.time
            entry = entry.jsonPayload
        elif entry.message is None and isinstance(entry.log, str):  # Docker's json-file wrapper
            # msgspec never decodes a lone surrogate; should one come, surrogatepass makes it a bad line, not a crash
            inner = self.entry_in(entry.log.encode("utf-8", "surrogatepass"), where)
            if inner is None:
                return
            entry = inner
            stamp = entry.time
        else:
            stamp = entry.time
        if entry.message != "decision":
            return
        route, decision, enforced = entry.route, entry.decision, entry.enforced
        if not isinstance(route, str) or not isinstance(decision, str) or not isinstance(enforced, bool):
            self.bad_line(where)
            return
        if isinstance(stamp, dt.datetime):
            t = (stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=dt.UTC)).timestamp()
        elif stamp is not None:
            t = float(stamp)
        else:
            self.bad_line(where)
            return
        if self.since is not None and t < self.since:
            return
        if decision == "suppressed" and isinstance(entry.reason, str) and entry.reason.startswith(WITHIN):
            decision = WITHIN_TOLERANCE  # counted under its own name (`skip-rate`)
        k = (route, self.label(t), decision, enforced)
        self.counts[k] = self.counts.get(k, 0) + 1

    def rows(self) -> list[DecisionCount]:
        return [
            {"route": r, "bucket": b, "decision": d, "enforced": e, "n": n}
            for (r, b, d, e), n in sorted(self.counts.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", *kv[0][2:]))
        ]


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


def _count_lines(lines: Iterable[bytes], counter: _Counter, start: int) -> None:
    for n, line in enumerate(lines, start):
        entry = counter.entry_in(line, n)
        if entry is not None:
            counter.add(entry, n)


def counts_from_log(source: str, since: float | None, by: str) -> list[DecisionCount]:
    """Decisions counted per (route, bucket, decision, enforced) from log lines in `source`.

    `source` is a path or `-` (stdin); `since` is epoch seconds (None: everything);
    `by` is route, hour or day. Raises OSError when the file cannot be read.
    """
    counter = _Counter(since, by)
    with _open(source) as fh:
        first, lineno = b"", 0
        for first in fh:
            lineno += 1
            first = first.removeprefix(b"\xef\xbb\xbf").lstrip()
            if first:
                break
        if _is_array(first):
            try:
                entries = _decode_entries(first + fh.read())
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                print(f"warning: {source} looks like a JSON array but cannot be read: {exc}", file=sys.stderr)
                return []
            for i, entry in enumerate(entries, 1):
                counter.add(entry, i)
            what = "entries"
        else:
            _count_lines([first], counter, lineno)
            _count_lines(fh, counter, lineno + 1)
            what = "lines"
    if counter.bad:
        name = "stdin" if source == "-" else source
        unit = what if counter.bad > 1 else what[:-1]
        print(
            f"warning: {counter.bad} {unit} in {name} looked like decisions but could not be read, "
            f"so {'they were' if counter.bad > 1 else 'it was'} not counted (first: {what[:-1]} {counter.first_bad})",
            file=sys.stderr,
        )
    return counter.rows()


_decode_any = msgspec.json.Decoder().decode


def _decision_of(obj: Any) -> tuple[dict[str, Any], Any] | None:
    """The decision line in a decoded object (ours, a LogEntry, Docker's wrapper) and its time."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("jsonPayload"), dict):
        inner = obj["jsonPayload"]
        return (inner, obj.get("timestamp") or inner.get("time")) if inner.get("message") == "decision" else None
    if obj.get("message") is None and isinstance(obj.get("log"), str):
        line = obj["log"]
        brace = line.find("{")
        if brace < 0:
            return None
        try:
            return _decision_of(_decode_any(line[brace:].encode("utf-8", "surrogatepass")))
        except (msgspec.DecodeError, UnicodeEncodeError):
            return None
    return (obj, obj.get("time")) if obj.get("message") == "decision" else None


def _seconds(stamp: Any) -> float | None:
    if isinstance(stamp, int | float) and not isinstance(stamp, bool):
        return float(stamp)
    if isinstance(stamp, str):
        try:
            t = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        except ValueError:
            return None
        return (t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)).timestamp()
    return None


def _row_of(obj: Any, route: str, since: float | None) -> DecisionRow | None:
    found = _decision_of(obj)
    if found is None:
        return None
    line, stamp = found
    t = _seconds(stamp)
    if line.get("route") != route or t is None or (since is not None and t < since):
        return None
    return {
        "time": t,
        "decision": str(line.get("decision")),
        "enforced": line.get("enforced") is not False,
        "key": line.get("key"),
        "reason": line.get("reason"),
        "fingerprint": line.get("fingerprint"),
        "previous_fingerprint": line.get("previous_fingerprint"),
        "extra": line,  # the record's `extra` keys are spread into the line
    }


def rows_from_log(source: str, route: str, since: float | None) -> list[DecisionRow]:
    """One route's decisions from log lines in `source` (the sources `counts_from_log` reads),
    in time order; lines that cannot be read are skipped (`skip-rate` counts and reports them).
    Read line by line, as `counts_from_log` does; only the gcloud array is read whole."""
    found: list[DecisionRow] = []
    with _open(source) as fh:
        first = b""
        for first in fh:
            first = first.removeprefix(b"\xef\xbb\xbf").lstrip()
            if first:
                break
        objects: Iterable[Any]
        if _is_array(first):
            try:
                entries = _decode_any(first + fh.read())
            except msgspec.DecodeError:
                return []
            objects = entries if isinstance(entries, list) else []
        else:
            objects = _objects(itertools.chain([first], fh))
        for obj in objects:
            row = _row_of(obj, route, since)
            if row is not None:
                found.append(row)
    found.sort(key=lambda r: r["time"])
    return found


def _objects(lines: Iterable[bytes]) -> Iterator[Any]:
    for line in lines:
        brace = line.find(b"{")
        if b"decision" not in line or brace < 0:
            continue
        try:
            yield _decode_any(line[brace:])
        except msgspec.DecodeError:
            continue


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
