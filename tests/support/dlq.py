"""Dead letters on the Pub/Sub emulator, and `pubsub-filter pull` / `replay` as real subprocesses.

    rig = DeadLetterRig.create(admin)                 # source topic → pull sub (DLQ after 5) → DLQ topic → DLQ sub
    ids = [admin.publish(rig.source, b"...")]
    rig.dead_letter(ids)                               # the failing consumer: nack each id 5 times
    rig.peek_dead_letters(len(ids))                    # what the DLQ holds (released again at once)
    result = run_replay([rig.dlq_sub, "--wait", "1"], env)
    rig.cleanup()

`PullProcess` is `ServeProcess` for `pubsub-filter pull`: ready when it logs `pulling`,
stopped with SIGTERM (and it must exit 0).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.api_core import exceptions as gexc

from .pubsub_helpers import PubsubAdmin, unique
from .serve import START_DEADLINE, STOP_DEADLINE, ServeProcess, serve_executable

MAX_ATTEMPTS = 5


@dataclass
class Peeked:
    message_id: str
    data: bytes
    attributes: dict[str, str]
    ordering_key: str
    publish_time: str  # RFC 3339, as Pub/Sub gave it
    delivery_attempt: int


def peek(admin: PubsubAdmin, sub_id: str, count: int, timeout: float = 20.0) -> list[Peeked]:
    """Pull until `count` distinct messages were seen (or `timeout`), then release them all (nothing acked)."""
    path = admin.subscription_path(sub_id)
    seen: dict[str, Peeked] = {}
    ack_ids: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(seen) < count and (remaining := deadline - time.monotonic()) > 0:
            try:
                resp = admin.subscriber.pull(
                    request={"subscription": path, "max_messages": 1000},
                    timeout=max(min(remaining, 5.0), 0.5),
                    retry=None,
                )
            except gexc.DeadlineExceeded:
                continue
            for r in resp.received_messages:
                ack_ids.append(r.ack_id)
                m = r.message
                seen.setdefault(
                    m.message_id,
                    Peeked(
                        m.message_id,
                        bytes(m.data),
                        dict(m.attributes),
                        m.ordering_key,
                        m.publish_time.rfc3339(),
                        r.delivery_attempt,
                    ),
                )
    finally:
        if ack_ids:
            admin.subscriber.modify_ack_deadline(
                request={"subscription": path, "ack_ids": ack_ids, "ack_deadline_seconds": 0}
            )
    return list(seen.values())


@dataclass
class DeadLetterRig:
    """A source topic whose pull subscription dead-letters after 5 attempts, and the DLQ with its subscription."""

    admin: PubsubAdmin
    source: str
    sub: str
    dlq: str
    dlq_sub: str
    extra_subs: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, admin: PubsubAdmin, retain_acked: bool = False, dlq_ack_deadline: int = 10) -> DeadLetterRig:
        source = admin.topic("source")
        dlq = admin.topic("dlq")
        dlq_sub = unique("dlq-sub")
        admin.subscriber.create_subscription(
            request={
                "name": admin.subscription_path(dlq_sub),
                "topic": admin.topic_path(dlq),
                "ack_deadline_seconds": dlq_ack_deadline,
            }
        )
        sub = unique("src-sub")
        # No retry policy: the emulator redelivers a nack within ~1 s (a retry policy's
        # minimum backoff would make dead-lettering take minutes).
        admin.subscriber.create_subscription(
            request={
                "name": admin.subscription_path(sub),
                "topic": admin.topic_path(source),
                "ack_deadline_seconds": 10,
                "retain_acked_messages": retain_acked,
                "dead_letter_policy": {
                    "dead_letter_topic": admin.topic_path(dlq),
                    "max_delivery_attempts": MAX_ATTEMPTS,
                },
            }
        )
        return cls(admin, source, sub, dlq, dlq_sub)

    def subscription(self, topic: str, prefix: str = "pull") -> str:
        sub_id = unique(prefix)
        self.admin.subscriber.create_subscription(
            request={
                "name": self.admin.subscription_path(sub_id),
                "topic": self.admin.topic_path(topic),
                "ack_deadline_seconds": 30,
            }
        )
        self.extra_subs.append(sub_id)
        return sub_id

    def dead_letter(self, ids: Sequence[str], timeout: float = 40.0) -> None:
        """Be the failing consumer: nack every delivery on `sub` until each id was nacked on its last attempt.

        Acks (and so drops) anything else that arrives, so only `ids` end up dead-lettered.
        """
        path = self.admin.subscription_path(self.sub)
        wanted = set(ids)
        last: set[str] = set()  # nacked on their last attempt
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"not dead-lettered within {timeout:g}s: {sorted(wanted - last)}"
            # The emulator moves a message to the dead-letter topic when it would deliver it
            # once more, i.e. on a later pull of the source subscription.
            if last == wanted and len(self.peek_dead_letters(len(wanted), timeout=0.5)) == len(wanted):
                return
            try:
                resp = self.admin.subscriber.pull(
                    request={"subscription": path, "max_messages": 1000}, timeout=min(remaining, 1.0), retry=None
                )
            except gexc.DeadlineExceeded:
                continue
            nack = [r.ack_id for r in resp.received_messages if r.message.message_id in wanted]
            ack = [r.ack_id for r in resp.received_messages if r.message.message_id not in wanted]
            for r in resp.received_messages:
                if r.message.message_id in wanted and r.delivery_attempt >= MAX_ATTEMPTS:
                    last.add(r.message.message_id)
            if nack:
                self.admin.subscriber.modify_ack_deadline(
                    request={"subscription": path, "ack_ids": nack, "ack_deadline_seconds": 0}
                )
            if ack:
                self.admin.subscriber.acknowledge(request={"subscription": path, "ack_ids": ack})

    def peek_dead_letters(self, count: int, timeout: float = 20.0) -> list[Peeked]:
        return peek(self.admin, self.dlq_sub, count, timeout)

    def cleanup(self) -> None:
        for sub_id in (self.sub, self.dlq_sub, *self.extra_subs):
            self.admin.delete_subscription(sub_id)


# --- the commands as subprocesses ---------------------------------------------------------------


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def command_env(env: Mapping[str, str]) -> dict[str, str]:
    out = dict(os.environ)
    out.update(env)
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


def run_replay(args: Sequence[str], env: Mapping[str, str], timeout: float = 90.0) -> Result:
    proc = subprocess.run(
        [serve_executable(), "replay", *args],
        env=command_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


class ReplayProcess:
    """`pubsub-filter replay` in the background, for interrupting it."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], log_dir: Path):
        self.out = log_dir / f"replay-{unique('out')}.txt"
        self.err = self.out.with_suffix(".err")
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [serve_executable(), "replay", *args],
                env=command_env(env),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> Result:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"replay did not finish within {timeout:g}s:\n{self.result()}") from None
        return self.result(code)

    def result(self, code: int | None = None) -> Result:
        return Result(
            self.proc.returncode if code is None else code,
            self.out.read_text(errors="replace"),
            self.err.read_text(errors="replace"),
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


class PullProcess(ServeProcess):
    """`pubsub-filter pull --config FILE`: ready once it logs `pulling`; `stop()` sends SIGTERM."""

    def __init__(self, config_path: Path, log_path: Path, env: Mapping[str, str] | None = None, name: str = "pull"):
        super().__init__(config_path, log_path, env=env, name=name)
        self.routes: list[str] = []

    def start(self, deadline: float = START_DEADLINE) -> PullProcess:
        env = command_env(self.extra_env)
        env.setdefault("LOG_FORMAT", "json")
        cmd = [serve_executable(), "pull", "--config", str(self.config_path)]
        for route in self.routes:
            cmd += ["--route", route]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(self.config_path.parent),
                start_new_session=True,
            )
        until = time.monotonic() + deadline
        while not any(e.get("message") == "pulling" for e in self.events()):
            code = self.proc.poll()
            if code is not None:
                self.returncode = code
                self.proc = None
                raise AssertionError(f"{self.name} exited with {code} before it pulled:\n{self.tail()}")
            if time.monotonic() > until:
                self.kill()
                raise AssertionError(f"{self.name} did not start pulling within {deadline:g}s:\n{self.tail()}")
            time.sleep(0.05)
        return self

    def stop(self, deadline: float = STOP_DEADLINE) -> int:
        code = super().stop(deadline)
        assert code == 0, f"{self.name} exited with {code} after SIGTERM, expected 0:\n{self.tail()}"
        return code

    def wait_events(self, done: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll the log until `done(events)` holds."""
        until = time.monotonic() + timeout
        while True:
            events = self.events()
            if done(events):
                return events
            if time.monotonic() > until:
                raise AssertionError(f"condition not reached within {timeout:g}s:\n{self.tail()}")
            time.sleep(0.05)


def counted(result: Any, label: str) -> int:
    """The number a `replay` run's summary gives on its `label:` line."""
    for line in result.stdout.splitlines():
        if line.strip().startswith(label + ":"):
            return int(line.split(":", 1)[1].split()[0])
    raise AssertionError(f"no {label!r} line in the summary:\n{result}")
