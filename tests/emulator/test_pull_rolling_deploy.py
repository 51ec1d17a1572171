"""A rolling deploy of `pubsub-filter pull` on the Pub/Sub emulator: SIGTERM to the old worker
mid-stream while the new one runs.

The old worker holds more messages than it works on (the client library keeps what Pub/Sub sent
past the flow control's `max_messages` on hold, and extends their leases), with the default flow
control. Everything it received must come back within seconds: what it had not started, what it
had started and the stop cancelled (its lease released), so the new worker forwards it all within
seconds of the SIGTERM; before, some came back only when the extended lease ran out (60-180 s).
Every message must reach downstream exactly once. Both workers share one Firestore, as two pods
do; the old worker reaches it through a delay, so it works slowly and is mid-stream at the SIGTERM.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from google.api_core import exceptions as gexc

from tests.support.dlq import PullProcess
from tests.support.emulators import FirestoreEmulator, PubsubEmulator
from tests.support.pubsub_helpers import DelayProxy, PubsubAdmin, unique
from tests.support.serve import write_config

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(240)]

ROUTE = "rolling"
MESSAGES = 400
#: The most the last message may trail the old worker's SIGTERM: its stop (8 s at most) and a
#: few seconds, well below the 60 s lease extension a message held by the library would wait out.
PROMPT = 15.0
#: How long the old worker's requests to Firestore are held: it works slowly, so it is mid-stream.
SLOW = 1.0


class Deploy:
    def __init__(self, emu: PubsubEmulator, firestore: FirestoreEmulator, tmp_path: Path):
        self.emu = emu
        self.firestore = firestore
        self.collection = unique("rolling")
        self.tmp_path = tmp_path
        self.admin = PubsubAdmin(emu)
        self.source = self.admin.topic("source")
        # the ack deadline Terraform and `provision` give a pull subscription (lease.ack_deadline)
        self.sub = self.admin.pull_subscription(self.source, "src-sub", ack_deadline=60)
        self.dest = self.admin.topic("dest")
        self.dest_sub = self.admin.pull_subscription(self.dest, "downstream")
        self.procs: list[PullProcess] = []

    def start(self, name: str, firestore_host: str) -> PullProcess:
        config = {
            "project": self.emu.project,
            "store": {"backend": "firestore", "collection": self.collection},
            "publisher": {"backend": "pubsub"},
            "records": {"backend": "sqlite", "path": str(self.tmp_path / f"{name}-decisions.db")},
            "routes": [{"name": ROUTE, "subscription": self.sub, "destination": self.dest, "key": ["payload.k"]}],
        }
        path = write_config(self.tmp_path / f"{name}.yaml", config)
        env = {
            "PUBSUB_EMULATOR_HOST": self.emu.host,
            "FIRESTORE_EMULATOR_HOST": firestore_host,
            "GOOGLE_CLOUD_PROJECT": self.emu.project,
        }
        proc = PullProcess(path, self.tmp_path / f"{name}.log", env=env, name=name)
        self.procs.append(proc)
        return proc.start()

    def downstream(self, want: set[str], timeout: float) -> list[tuple[float, str]]:
        """(arrival time, source message id) of every copy downstream until every id in `want`
        arrived and then 3 s more passed with nothing new, or `timeout`."""
        path = self.admin.subscription_path(self.dest_sub)
        got: list[tuple[float, str]] = []
        until = time.monotonic() + timeout
        quiet_until: float | None = None
        while (now := time.monotonic()) < until and (quiet_until is None or now < quiet_until):
            try:
                resp = self.admin.subscriber.pull(
                    request={"subscription": path, "max_messages": 1000}, timeout=1.0, retry=None
                )
            except gexc.DeadlineExceeded:
                continue
            arrived = time.monotonic()
            for r in resp.received_messages:
                got.append((arrived, r.message.attributes["filter_source_message_id"]))
            if resp.received_messages:
                self.admin.subscriber.acknowledge(
                    request={"subscription": path, "ack_ids": [r.ack_id for r in resp.received_messages]}
                )
            if quiet_until is None and want <= {mid for _, mid in got}:
                quiet_until = arrived + 3.0
        return got

    def close(self) -> None:
        for proc in self.procs:
            if proc.proc is not None:
                proc.kill()
        self.admin.cleanup()


@pytest.fixture
def deploy(pubsub_emulator: PubsubEmulator, firestore: FirestoreEmulator, tmp_path: Path) -> Iterator[Deploy]:
    with closing(Deploy(pubsub_emulator, firestore, tmp_path)) as d:
        yield d


def test_a_rolling_deploy_hands_every_message_on_at_once_and_exactly_once(
    deploy: Deploy, firestore: FirestoreEmulator
) -> None:
    with DelayProxy(firestore.host, delay=SLOW) as slow:
        old = deploy.start("old", slow.host)
        items: list[tuple[bytes, dict[str, str]]] = [(json.dumps({"k": i}).encode(), {}) for i in range(MESSAGES)]
        ids = deploy.admin.publish_many(deploy.source, items)
        old.wait_decisions(lambda ds: len(ds) >= 1, timeout=60)
        new = deploy.start("new", firestore.host)
        handled_before = len(old.decisions())
        assert handled_before < MESSAGES / 2, f"the old worker was not mid-stream: {handled_before} decided"
        terminated = time.monotonic()
        old.stop()
        stopped_after = time.monotonic() - terminated
    got = deploy.downstream(set(ids), timeout=PROMPT + 45)
    new.stop()
    copies: dict[str, int] = {}
    for _, mid in got:
        copies[mid] = copies.get(mid, 0) + 1
    assert sorted(copies) == sorted(ids), f"{len(set(ids) - set(copies))} of {MESSAGES} never reached downstream"
    assert {mid: n for mid, n in copies.items() if n > 1} == {}
    # Every message comes at once: those the old worker did not start (most of them held by the
    # client library past its flow control), and those whose decision its stop cancelled.
    last = max(t for t, _ in got) - terminated
    by_old = sum(d["decision"] == "forwarded" for d in old.decisions())
    assert last < PROMPT, (
        f"the last message reached downstream {last:.1f}s after the old worker's SIGTERM "
        f"(it stopped in {stopped_after:.1f}s and forwarded {by_old}; the new one forwarded the rest)\n"
        + late_story({mid for t, mid in got if t - terminated >= PROMPT}, old, new)
    )


def late_story(late: set[str], old: PullProcess, new: PullProcess) -> str:
    """What each worker logged about the late messages, and the old worker's stop: what a
    failure needs to be told apart (a nack lost at the stop, a lease left held, a lost stream)."""
    lines = [f"late: {len(late)} messages, e.g. {sorted(late)[:5]}"]
    keys = {e.get("key") for proc in (old, new) for e in proc.decisions() if e.get("message_id") in late}
    for proc in (old, new):
        about = [
            e
            for e in proc.events()
            if e.get("message_id") in late
            or e.get("key") in keys
            or not str(e.get("message")).startswith(("decision", "lease_"))
        ]
        lines += [f"--- {proc.name}: {len(about)} lines about them or the worker (the last 40)"]
        lines += [json.dumps(e)[:400] for e in about[-40:]]
    return "\n".join(lines)
