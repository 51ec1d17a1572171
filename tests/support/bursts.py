"""Bursts of large row pushes against a `pubsub-filter serve` process, as Pub/Sub sends them at
once: each push on its own connection, a 429 sent again once another push of the burst was
answered (Pub/Sub backs off and redelivers), and `/healthz` asked throughout.

The bodies share one base64 text (sent as parts with a declared length), so a burst of 40
pushes of 11 MB costs the test process one copy, not 40."""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

#: The rows route of the burst (the example's injury-report shape, no `include`: every field counts).
ROWS_ROUTE = {
    "name": "rows",
    "destination": "out",
    "key": ["attributes.id"],
    "rows": "payload.players",
    "row_key": ["player_lookup", "game_id"],
}


def rows_payload(rows: int) -> bytes:
    """A JSON payload of `rows` small rows (~125 bytes each: 68,000 rows make 8.5 MB)."""
    players = [
        {
            "player_lookup": f"player{i:06d}",
            "game_id": f"g{i % 15}",
            "team": "LAL",
            "status": "Out",
            "reason": "Injury/Illness - Left Ankle",
        }
        for i in range(rows)
    ]
    return json.dumps({"game_date": "2026-01-01", "players": players}).encode()


@dataclass(frozen=True)
class Push:
    """One wrapped push, as parts: its envelope around a shared base64 text."""

    message_id: str
    key: str
    parts: tuple[bytes, ...]

    @property
    def size(self) -> int:
        return sum(map(len, self.parts))


def pushes(data: bytes, keys: list[str]) -> list[Push]:
    """A push of `data` for each of `keys` (message ids m0, m1, ...), sharing one base64 text."""
    encoded = base64.b64encode(data)
    out = []
    for i, key in enumerate(keys):
        head = json.dumps({"subscription": "projects/p/subscriptions/s"})[:-1]
        message = {"messageId": f"m{i}", "publishTime": "2026-01-01T00:00:00Z", "attributes": {"id": key}}
        prefix = (head + ', "message": ' + json.dumps(message)[:-1] + ', "data": "').encode()
        out.append(Push(f"m{i}", key, (prefix, encoded, b'"}}')))
    return out


@dataclass
class Burst:
    """What one burst saw: every answer of every push, in order, and each `/healthz` answer's
    time, less the time the server's threads and the probe's own thread waited for a CPU (a
    shared machine's, not the server's)."""

    answers: dict[str, list[int | str]] = field(default_factory=dict)
    health: list[float] = field(default_factory=list)
    took: float = 0.0


def run_burst(port: int, pid: int, burst: list[Push], deadline: float = 300.0) -> Burst:
    """Post every push of `burst` at once, each until it is answered other than 429 (a 429 is sent
    again once another push was answered, or after a second when none is left in flight)."""
    seen = Burst(answers={p.message_id: [] for p in burst})
    answered = threading.Condition()
    done = [0]

    def post(push: Push) -> None:
        until = time.monotonic() + deadline
        while time.monotonic() < until:
            with answered:
                before = done[0]
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline)
                conn.putrequest("POST", "/push/rows")
                conn.putheader("content-type", "application/json")
                conn.putheader("content-length", str(push.size))
                conn.endheaders()
                for part in push.parts:
                    conn.send(part)
                resp = conn.getresponse()
                resp.read()
                conn.close()
                status: int | str = resp.status
            except OSError as exc:
                status = f"{type(exc).__name__}: {exc}"
            seen.answers[push.message_id].append(status)
            with answered:
                if status != 429:
                    done[0] += 1
                    answered.notify_all()
                    return
                # Pub/Sub backs off and sends it again: here, once another push was answered
                answered.wait_for(lambda b=before: done[0] > b, timeout=1.0)  # type: ignore[misc]

    posters = [threading.Thread(target=post, args=(p,)) for p in burst]
    with HealthProbe(port, pid) as prober:
        started = time.perf_counter()
        for t in posters:
            t.start()
        for t in posters:
            t.join()
        seen.took = time.perf_counter() - started
    seen.health = prober.took
    return seen


#: The health probe's process: GET /healthz every 20 ms until its stdin closes, then one JSON
#: line of how long each took, less the time the server's threads and the probe's own thread
#: were runnable without a CPU. Every thread of the server's process, not only the loop's: the
#: loop also waits for whichever of them holds the GIL while the machine keeps it off a CPU (the
#: outbox's, the records writer's). The server's large-message process is not one of them: it
#: holds no GIL of the server's. A process of its own, collector off, as Cloud Run's
#: probe is: in the test's process its turns waited for the GIL behind the 40 posting threads
#: and for the collections of the whole suite's heap (464 ms seen in CI, 116 ms alone).
_PROBE = """
import gc, http.client, json, select, sys, time
gc.disable()
import os
port, server = int(sys.argv[1]), sys.argv[2]
OWN = "/proc/thread-self/schedstat"
def waited(path):
    try:
        return int(open(path).read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
def server_waited():
    tasks = f"/proc/{server}/task"
    try:
        return sum(waited(f"{tasks}/{t}/schedstat") for t in os.listdir(tasks))
    except OSError:
        return 0.0
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
took = []
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0.02)[0]:
    before, own = server_waited(), waited(OWN)
    started = time.perf_counter()
    conn.request("GET", "/healthz")
    conn.getresponse().read()
    took.append(time.perf_counter() - started - (server_waited() - before) - (waited(OWN) - own))
conn.close()
print(json.dumps(took), flush=True)
"""


class HealthProbe:
    """`/healthz` probed from a process of its own while the block runs (`_PROBE`); `took`
    holds each answer's time once the block ends."""

    def __init__(self, port: int, pid: int) -> None:
        self.args = [sys.executable, "-c", _PROBE, str(port), str(pid)]
        self.took: list[float] = []

    def __enter__(self) -> HealthProbe:
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline() != "ready\n":  # it failed to start: stop it, say so
            self.proc.kill()
            self.proc.communicate(timeout=60)
            raise AssertionError(f"the health probe did not start (exit {self.proc.returncode})")
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self.proc.communicate("stop\n", timeout=60)
        if exc[0] is None:
            assert self.proc.returncode == 0, out
            self.took = json.loads(out.splitlines()[-1])


def process_tree(pid: int) -> list[int]:
    """`pid` and every process under it (the server's large-message process among them)."""
    found, todo = [], [pid]
    while todo:
        here = todo.pop()
        found.append(here)
        for task in Path(f"/proc/{here}/task").iterdir():
            todo.extend(int(c) for c in (task / "children").read_text().split())
    return found


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def peak_rss_mib(pid: int) -> float:
    """The peak resident memory of `pid` and the processes under it, each at its own peak: what
    the instance's memory limit must hold at most (their peaks may not coincide)."""
    return sum(status_kib(p, "VmHWM") for p in process_tree(pid)) / 1024
