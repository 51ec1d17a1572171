"""CPU instructions per decision log line (callgrind), the line alone: the suppressed decision's
line as `serve` writes it (JSON at info, to a pipe-like binary stream), from its record.

    .venv/bin/python bench/decision_line.py [--lines 2000] [--tree DIR]

Instructions per line = (count with N lines - count with 0) / N, so start-up cancels out.
`--tree DIR` counts the same with the `filter` package found in DIR (an earlier commit's, from
`git archive COMMIT filter | tar -x -C DIR`): before and after in one run. Needs valgrind.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import callgrind  # bench/callgrind.py: this script's directory is on sys.path
import harness
from harness import ROOT

CHILD = r"""
import os, sys
from pubsub_filter.observability import logsetup
try:
    from pubsub_filter.core.engine.record import log_decision
except ImportError:  # a tree from before the record had a module of its own
    from pubsub_filter.core.engine.engine import _log_decision as log_decision
from pubsub_filter.core.model import Decision, DecisionRecord
logsetup.configure(level="info", fmt="json", project="p", stream=open(os.devnull, "w"))
rec = DecisionRecord(
    time=1764000000.123456, route="injury-report", decision=Decision.SUPPRESSED, enforced=True,
    message_id="123456789", key="2025-01-10", reason="unchanged since last forward",
    fingerprint="sha256:" + "a" * 64, message_fingerprint="sha256:" + "b" * 64,
    previous_fingerprint="sha256:" + "a" * 64, latency_ms=0.4, trace="0123456789abcdef0123456789abcdef",
    details={"rows": 1},
)
log_decision(rec)  # the first line builds and caches the logger
for _ in range(int(sys.argv[1])):
    log_decision(rec)
"""


def per_line(lines: int, tree: Path) -> float:
    return (callgrind.instructions(CHILD, [str(lines)], tree) - callgrind.instructions(CHILD, ["0"], tree)) / lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=2000, help="decision lines per count (default 2000)")
    parser.add_argument("--tree", type=Path, help="also count with the filter package in this dir")
    harness.add_smoke(parser)
    args = parser.parse_args()
    harness.smoke(args, lines=2)
    if shutil.which("valgrind") is None and not harness.smoking():
        raise SystemExit("needs valgrind: apt-get install valgrind")
    print(harness.machine_line())
    print(f"instructions per decision line, {args.lines} lines, PYTHONHASHSEED=0")
    ours = per_line(args.lines, ROOT)
    print(f"  this tree   {ours:10,.0f}")
    if args.tree:
        theirs = per_line(args.lines, args.tree.resolve())
        print(f"  --tree      {theirs:10,.0f}   this / --tree {ours / theirs:.3f}")


if __name__ == "__main__":
    main()
