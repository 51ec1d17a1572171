"""What a replay run counts, how it shows progress while it runs, and its closing summary."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import IO, Any

from tqdm import tqdm

from pubsub_filter.replay.options import ReplayOptions


@dataclass
class Counts:
    replayed: int = 0  # republished, or forwarded by the filter
    skipped: int = 0  # through the filter: acked without a publish (suppressed, duplicate, stale)
    filtered_out: int = 0  # --where / --since / --until: left in the dead-letter subscription
    left: int = 0  # beyond --max: left for a later run
    failed: int = 0  # not replayed now: left in the dead-letter subscription
    would_replay: int = 0  # --dry-run
    ack_failed: int = 0  # replayed, but the ack did not go through: may be replayed again
    skipped_by: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)


class Progress:
    """On a terminal, a tqdm bar: done out of `total` (`--max`) with rate and ETA, or a
    counter with its rate when the total is unknown (Pub/Sub does not tell a subscription's
    backlog). Elsewhere (a pipe, a log file), a plain line every `interval` seconds."""

    def __init__(self, stream: IO[str], counts: Counts, dry_run: bool, interval: float = 5.0, total: int | None = None):
        self.stream = stream
        self.counts = counts
        self.dry_run = dry_run
        isatty = getattr(stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.interval = interval
        self.started = time.monotonic()
        self._last = 0.0
        self._bar: tqdm[Any] | None = None
        if self.tty:
            self._bar = tqdm(
                total=total,
                file=stream,
                desc="dry run" if dry_run else "replay",
                unit="msg",
                dynamic_ncols=True,
                mininterval=0.1,
                smoothing=0.1,
            )

    def _done(self) -> int:
        c = self.counts
        return c.would_replay if self.dry_run else c.replayed + c.skipped

    def _others(self) -> list[str]:
        c = self.counts
        parts = []
        if c.skipped:
            parts.append(f"{c.skipped} skipped by the filter")
        parts.append(f"{c.filtered_out} filtered out")
        parts.append(f"{c.failed} failed")
        return parts

    def line(self) -> str:
        c = self.counts
        elapsed = max(time.monotonic() - self.started, 1e-9)
        head = f"{c.would_replay} would be replayed" if self.dry_run else f"{c.replayed} replayed"
        parts = [head, *self._others()]
        return f"replay: {', '.join(parts)} | {self._done() / elapsed:.1f} msg/s | {elapsed:.0f}s"

    def update(self, force: bool = False) -> None:
        bar = self._bar
        if bar is not None:
            bar.set_postfix_str(", ".join(self._others()), refresh=False)
            bar.update(self._done() - bar.n)  # tqdm throttles redraws itself (mininterval)
            if force:
                bar.refresh()
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        self.stream.write(self.line() + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self._bar is not None:
            self.update(force=True)
            self._bar.close()


def summary(counts: Counts, opts: ReplayOptions, elapsed: float, interrupted: bool, error: str | None = None) -> str:
    lines = []
    head = f"replay of {opts.subscription}"
    if interrupted:
        head += " (interrupted)"
    lines.append(head + f": {elapsed:.1f}s")
    if error:
        lines.append(f"  stopped early:         {error}")
    if opts.dry_run:
        lines.append(f"  would be replayed:     {counts.would_replay}")
    else:
        rate = counts.replayed / elapsed if elapsed > 0 else 0.0
        lines.append(f"  replayed:              {counts.replayed} ({rate:.1f} msg/s)")
        if opts.through_filter:
            detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.skipped_by.items()))
            lines.append(f"  skipped by the filter: {counts.skipped}" + (f" ({detail})" if detail else ""))
    lines.append(f"  filtered out:          {counts.filtered_out} (--where/--since/--until: left in place)")
    if counts.left:
        lines.append(f"  not taken (--max):     {counts.left} (left for a later run)")
    lines.append(f"  failed:                {counts.failed}" + (" (left in place)" if counts.failed else ""))
    for reason, n in counts.failures.most_common(5):
        lines.append(f"    {n} x {reason}")
    if counts.ack_failed:
        lines.append(f"  ack failed:            {counts.ack_failed} (replayed; may be replayed again by a rerun)")
    return "\n".join(lines)
