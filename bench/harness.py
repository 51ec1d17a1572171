"""What every bench shares: the repository on `sys.path`, the machine line, small statistics,
the markdown table, a free port, a process's CPU time, an OTLP sink, and `--smoke`.

Each bench is a script (`.venv/bin/python bench/NAME.py`); its own directory is on
`sys.path`, so `import harness` finds this module, and importing it puts the repository
root there too (the `filter` package and `tests.support`).

`--smoke` (every bench has it) runs one tiny round, only to show the bench still runs:
`make bench-smoke`, or tests/selfcheck/test_bench_smoke.py in `make test`. Its figures mean
nothing. Under it, `callgrind.instructions` runs its child without valgrind (see there).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.server
import os
import platform
import statistics
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.net import free_port  # noqa: E402

__all__ = ["ROOT", "free_port"]  # and the functions below

#: Set (to "1") in the environment by `--smoke`, so that children and helpers see it too.
SMOKE_ENV = "BENCH_SMOKE"
SMOKE_HELP = "one tiny round, only to check that the bench still runs (make bench-smoke); figures mean nothing"


def smoking() -> bool:
    return os.environ.get(SMOKE_ENV) == "1"


def add_smoke(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)


def smoke(args: argparse.Namespace, **tiny: Any) -> None:
    """Under `--smoke`, replace the arguments named with their tiny values and tell children so."""
    if getattr(args, "smoke", False):
        vars(args).update(tiny)
        os.environ[SMOKE_ENV] = "1"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def machine(**extra: Any) -> dict[str, Any]:
    """Where and when the figures were taken: CPU, cores, Python, UTC time and the load average."""
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "load": round(os.getloadavg()[0], 2),
        **extra,
    }


def machine_line(**extra: Any) -> str:
    m = machine(**extra)
    rest = "".join(f", {k} {v}" for k, v in extra.items())
    return f"{m['cpu']}, {m['nproc']} cores, Python {m['python']}, {m['utc']} UTC, load {m['load']}{rest}"


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |"]
    lines.append("|-" + "-|-".join("-" * w for w in widths) + "-|")
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join(lines)


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a running process so far (Linux /proc)."""
    if pid is None:
        return float("nan")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _OtlpSink(http.server.BaseHTTPRequestHandler):
    """Accepts any OTLP/HTTP export (answers 200, keeps nothing)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


def otlp_sink() -> tuple[http.server.ThreadingHTTPServer, str]:
    """A collector that drops everything, serving on a daemon thread: (server, its URL). `shutdown()` stops it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OtlpSink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
