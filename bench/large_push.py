"""Large messages through `pubsub-filter serve`: what one push of a message near Pub/Sub's 10 MB
costs the process in memory, and how long it keeps the instance's other requests waiting.

For each kind of message, a fresh `serve` (embedded default backends) gets `--together` pushes
at once (distinct keys, all forwarded). Reported per kind: the push body, the wall time, the
peak RSS growth over the idle process (`VmHWM` after `clear_refs`, so the peak of these
requests only) in total and per request, and the longest `/healthz` answer while they ran
(a health probe waits for the event loop like every other request: the loop hold seen from
outside).

    .venv/bin/python bench/large_push.py [--size 9990000] [--rows 38000] [--together 1,4] [--kinds raw,escaped,rows]
        [--tree DIR]

`--tree DIR` runs each server a second time on the `filter` package in DIR (an earlier commit's,
from `git worktree add DIR COMMIT`): before and after in one run.

Kinds: `raw` (random bytes, a route keyed on an attribute), `escaped` (0xFF bytes, whose base64
is all `/`, written `\\/` as the emulator writes it: the largest push), `rows` (a JSON payload of
`--rows` rows on a `rows` route, 9.9 MB at the default), `small-rows` (`--small-rows` rows of ~125
bytes, 8.5 MB at the default 68,000: what costs most per byte).

Past `server.max_bytes_in_flight` a push waits for room up to `server.admission_wait`, then is
answered 429 (`answers` counts them): it is sent again once another push of the burst is
answered, as Pub/Sub sends it again, so every push is decided.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import harness

from tests.support.bursts import process_tree, status_kib
from tests.support.bursts import rows_payload as small_rows_payload
from tests.support.serve import ServeProcess, write_config

CONFIG = {
    "routes": [
        {"name": "raw", "destination": "out", "key": ["attributes.id"]},
        {
            "name": "rows",
            "destination": "out",
            "key": ["attributes.id"],
            "rows": "payload.players",
            "row_key": ["player_lookup", "game_id"],
        },
    ]
}


#: The message each server is warmed with: past `OFF_LOOP_BYTES`, so its large-message process runs.
WARM = json.dumps({"players": [], "pad": "x" * 300_000}).encode()


def rows_payload(rows: int) -> bytes:
    players = [
        {
            "player_lookup": f"player{i:05d}",
            "game_id": f"g{i % 15}",
            "team": "LAL",
            "game_date": "2026-01-01",
            "injury_status": "Out",
            "reason": "Injury/Illness - Left Ankle; Sprain" + "x" * 65,
            "reason_category": "injury",
        }
        for i in range(rows)
    ]
    return json.dumps({"game_date": "2026-01-01", "players": players}).encode()


def body_of(kind: str, data: bytes, key: str) -> bytes:
    message = {
        "data": base64.b64encode(data).decode(),
        "messageId": key,
        "message_id": key,
        "publishTime": "2026-01-01T00:00:00Z",
        "publish_time": "2026-01-01T00:00:00Z",
        "attributes": {"id": key},
    }
    text = json.dumps({"subscription": "projects/p/subscriptions/s", "message": message}, separators=(",", ":"))
    return (text.replace("/", "\\/") if kind == "escaped" else text).encode()


def tree_kib(pid: int, field: str) -> int:
    """`field` of `/proc/PID/status`, summed over `pid` and its large-message process."""
    return sum(status_kib(p, field) for p in process_tree(pid))


class Answered:
    """How many pushes of a burst were answered other than 429: what a 429 waits on to be sent again."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.done = 0


def post(port: int, path: str, body: bytes, out: list[int], answered: Answered | None = None) -> None:
    """Post until the answer is not 429; a 429 is sent again once another push was answered."""
    while True:
        before = answered.done if answered is not None else 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        conn.request("POST", path, body, {"content-type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        out.append(resp.status)
        if answered is None:
            return
        with answered.cond:
            if resp.status != 429:
                answered.done += 1
                answered.cond.notify_all()
                return
            answered.cond.wait_for(lambda b=before: answered.done > b, timeout=1.0)  # type: ignore[misc]


def probe(port: int, stop: threading.Event, worst: list[float]) -> None:
    """Ask /healthz every 5 ms until `stop`: the longest answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    while not stop.is_set():
        started = time.perf_counter()
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        worst[0] = max(worst[0], time.perf_counter() - started)
        stop.wait(0.005)
    conn.close()


def run(kind: str, together: int, args: argparse.Namespace, workdir: Path, tree: str | None = None) -> list[str]:
    route = "rows" if kind in ("rows", "small-rows") else "raw"
    if kind == "rows":
        data = rows_payload(args.rows)
    elif kind == "small-rows":
        data = small_rows_payload(args.small_rows)
    else:
        data = os.urandom(args.size) if kind == "raw" else b"\xff" * args.size
    bodies = [body_of(kind, data, f"{kind}-{i}") for i in range(together)]
    here = workdir / f"{kind}-{together}-{'tree' if tree else 'this'}"
    here.mkdir()
    config = write_config(here / "filter.yaml", CONFIG)
    env = {"LOG_LEVEL": "warning"} | ({"PYTHONPATH": str(Path(tree) / "filter")} if tree else {})
    with ServeProcess(config, config.parent / "serve.log", env=env) as serve:
        assert serve.proc is not None
        pid, port = serve.proc.pid, serve.port
        # one large message first, so that the large-message process runs before the idle reading
        post(port, f"/push/{route}", body_of(kind, WARM, "warm"), [])
        idle = tree_kib(pid, "VmRSS")
        for p in process_tree(pid):
            Path(f"/proc/{p}/clear_refs").write_text("5")  # VmHWM from here on
        statuses: list[int] = []
        worst = [0.0]
        stop = threading.Event()
        prober = threading.Thread(target=probe, args=(port, stop, worst))
        answered = Answered()
        posters = [threading.Thread(target=post, args=(port, f"/push/{route}", b, statuses, answered)) for b in bodies]
        prober.start()
        started = time.perf_counter()
        for t in posters:
            t.start()
        for t in posters:
            t.join()
        took = time.perf_counter() - started
        stop.set()
        prober.join()
        grown = (tree_kib(pid, "VmHWM") - idle) / 1024
    assert statuses.count(200) == together and set(statuses) <= {200, 429}, f"{kind}: answers {statuses}"
    return [
        kind if tree is None else f"{kind} (--tree)",
        str(together),
        f"{statuses.count(429)} x 429",
        f"{len(bodies[0]) / 1e6:.1f} MB",
        f"{took * 1000:.0f} ms",
        f"{idle / 1024:.0f} MiB",
        f"+{grown:.0f} MiB",
        f"+{grown / together:.0f} MiB",
        f"{worst[0] * 1000:.0f} ms",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=9_990_000, help="bytes of data for raw and escaped")
    parser.add_argument("--rows", type=int, default=38_000, help="rows of the rows payload (38,000: 9.9 MB)")
    parser.add_argument("--together", default="1,4", help="pushes at once, comma-separated")
    parser.add_argument("--small-rows", type=int, default=68_000, help="rows of the small-rows payload (8.5 MB)")
    parser.add_argument("--kinds", default="raw,escaped,rows,small-rows")
    parser.add_argument("--tree", help="also run the servers on the `filter` package in DIR (an earlier commit's)")
    harness.add_smoke(parser)
    args = parser.parse_args()
    harness.smoke(args, size=100_000, rows=200, small_rows=200, together="1")
    print(harness.machine_line())
    rows = []
    with tempfile.TemporaryDirectory(prefix="large-push-") as tmp:
        for kind in args.kinds.split(","):
            for together in (int(n) for n in args.together.split(",")):
                for tree in (None, args.tree) if args.tree else (None,):
                    rows.append(run(kind, together, args, Path(tmp), tree))
    head = ["kind", "at once", "answers", "body", "wall", "idle RSS", "peak growth", "per push", "longest /healthz"]
    print(harness.markdown_table(head, rows))


if __name__ == "__main__":
    main()
