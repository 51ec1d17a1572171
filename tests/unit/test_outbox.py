"""The outbox publisher: a confirmed publish is one whole line; anything less fails and leaves no trace."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from pubsub_filter.backends.publishers.outbox import OutboxPublisher, read_outbox
from pubsub_filter.core.ports import PublishFailed

ROOT = Path(__file__).parents[2]


def run_child(mode: str, workdir: Path) -> dict[str, Any]:
    """tests/support/short_write.py in a child process (its file size limit must not touch this one)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.short_write", mode, str(workdir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def attrs(path: Path) -> list[dict[str, str]]:
    return [m["attributes"] for m in read_outbox(path).messages]


async def test_a_published_message_reads_back_whole(tmp_path: Path) -> None:
    outbox = OutboxPublisher(tmp_path / "o.jsonl")
    mid = await outbox.publish("topic", b"\x00data", {"a": "1"}, ordering_key="k")
    await outbox.close()
    read = read_outbox(tmp_path / "o.jsonl")
    assert read.bad == []
    (msg,) = read.messages
    assert (msg["id"], msg["destination"], msg["data"], msg["ordering_key"]) == (mid, "topic", "AGRhdGE=", "k")


def test_a_write_cut_short_by_the_file_size_limit_fails_the_publish_and_is_undone(tmp_path: Path) -> None:
    result = run_child("publisher", tmp_path)
    assert result["big"].startswith("PublishFailed: cannot append to"), result
    assert result["size_after"] == result["size_before"]  # the torn bytes were truncated away
    assert result["outbox"]["messages"] == [{"n": "1"}, {"n": "3"}]
    assert result["outbox"]["bad"] == []


def test_a_push_whose_forward_cannot_be_written_whole_is_not_acked_and_comes_back(tmp_path: Path) -> None:
    result = run_child("push", tmp_path)
    first = result["first"]
    assert first["status"] >= 500 and first["decision"] == "failed", first
    # nothing committed, the lease released: the redelivery is decided afresh
    assert result["state_after_failure"] == {"fp": None, "lease": False}
    assert result["outbox_after_failure"]["size"] == 0  # the torn bytes were truncated away
    assert (result["redelivery"]["status"], result["redelivery"]["decision"]) == (200, "forwarded")
    assert len(result["outbox"]["messages"]) == 1 and result["outbox"]["bad"] == []


async def test_a_torn_line_left_by_another_writer_does_not_swallow_the_next_message(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    outbox = OutboxPublisher(path)
    await outbox.publish("t", b"1", {"n": "1"})
    with path.open("ab") as f:
        f.write(b'{"id": "killed mid-wri')  # a writer died here
    await outbox.publish("t", b"2", {"n": "2"})
    await outbox.close()
    read = read_outbox(path)
    assert [m["attributes"] for m in read.messages] == [{"n": "1"}, {"n": "2"}]
    assert [(b.line, b.reason.split(":")[0]) for b in read.bad] == [(2, "not a message")]


def test_reading_a_torn_tail_keeps_the_lines_before_it_and_reports_it(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    path.write_bytes(b'{"attributes": {"n": "1"}}\n{"attributes": {"n": "2"}}\n{"attributes": {"n"')
    read = read_outbox(path)
    assert [m["attributes"] for m in read.messages] == [{"n": "1"}, {"n": "2"}]
    (bad,) = read.bad
    assert (bad.line, bad.offset, bad.reason) == (3, 54, "torn: no newline at the end of the file")


def test_reading_a_torn_line_in_the_middle_keeps_the_lines_on_both_sides(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    path.write_bytes(b'{"attributes": {"n": "1"}}\n{"attrib\n[1, 2]\n{"attributes": {"n": "3"}}\n')
    read = read_outbox(path)
    assert [m["attributes"] for m in read.messages] == [{"n": "1"}, {"n": "3"}]
    assert [b.line for b in read.bad] == [2, 3]
    assert "line 2 (byte 27): not a message" in str(read.bad[0])


def test_reading_a_missing_outbox_finds_nothing(tmp_path: Path) -> None:
    read = read_outbox(tmp_path / "none.jsonl")
    assert (read.messages, read.bad) == ([], [])


async def test_a_deleted_outbox_file_is_created_again_not_written_to_blind(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    outbox = OutboxPublisher(path)
    await outbox.publish("t", b"1", {"n": "1"})
    path.unlink()
    await outbox.publish("t", b"2", {"n": "2"})
    await outbox.close()
    assert attrs(path) == [{"n": "2"}]


async def test_a_publish_into_a_vanished_directory_fails(tmp_path: Path) -> None:
    outbox = OutboxPublisher(tmp_path / "dir" / "o.jsonl")
    (tmp_path / "dir").mkdir()
    await outbox.publish("t", b"1", {"n": "1"})
    shutil.rmtree(tmp_path / "dir")
    with pytest.raises(PublishFailed, match="cannot append to"):
        await outbox.publish("t", b"2", {"n": "2"})
    await outbox.close()


async def test_with_fsync_a_publish_is_confirmed_the_same_way(tmp_path: Path) -> None:
    outbox = OutboxPublisher(tmp_path / "o.jsonl", fsync=True)
    await outbox.publish("t", b"1", {"n": "1"})
    await outbox.close()
    assert attrs(tmp_path / "o.jsonl") == [{"n": "1"}]


async def test_ping_passes_when_the_outbox_can_be_appended_to_and_writes_nothing(tmp_path: Path) -> None:
    outbox = OutboxPublisher(tmp_path / "o.jsonl")
    await outbox.ping()  # raises when an append would fail
    assert (tmp_path / "o.jsonl").read_bytes() == b""
    await outbox.publish("t", b"1", {"n": "1"})
    await outbox.close()
    assert attrs(tmp_path / "o.jsonl") == [{"n": "1"}]


async def test_ping_fails_when_the_outbox_directory_is_gone(tmp_path: Path) -> None:
    outbox = OutboxPublisher(tmp_path / "gone" / "o.jsonl")
    with pytest.raises(OSError):
        await outbox.ping()


async def test_ping_fails_when_the_outbox_path_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "o.jsonl").mkdir()
    outbox = OutboxPublisher(tmp_path / "o.jsonl")
    with pytest.raises(OSError):
        await outbox.ping()


class _Shipper:
    """A log shipper on another thread: rename the outbox away, lock the renamed file (so an append
    in progress finishes), read it, delete it; again and again until stopped."""

    def __init__(self, path: Path):
        self.path, self.rotated = path, path.with_name(path.name + ".shipping")
        self.shipped: list[bytes] = []
        self.rotations = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shipper")

    def __enter__(self) -> _Shipper:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                os.rename(self.path, self.rotated)
            except FileNotFoundError:
                continue
            self.rotations += 1
            with self.rotated.open("rb") as f:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                self.shipped += f.read().splitlines()
                self.rotated.unlink()


@pytest.mark.loop_may_block("the shipper thread is joined in the test body while threads switch every microsecond")
async def test_every_confirmed_line_reaches_a_shipper_that_renames_locks_reads_and_deletes(
    tmp_path: Path,
) -> None:
    # Switch threads often, so the shipper's rename lands between an append's checks as often as it can.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    path = tmp_path / "o.jsonl"
    outbox = OutboxPublisher(path)
    confirmed = []
    try:
        with _Shipper(path) as shipper:
            for n in range(20_000):
                confirmed.append(await outbox.publish("t", b"", {"n": str(n)}))
    finally:
        sys.setswitchinterval(switch)
        await outbox.close()
    shipped = [json.loads(line)["id"] for line in shipper.shipped] + [m["id"] for m in read_outbox(path).messages]
    assert shipper.rotations > 10, "the shipper must have rotated the file under the writes"
    assert len(shipped) == len(confirmed), f"{len(confirmed) - len(set(shipped))} confirmed lines lost"
    assert sorted(shipped) == sorted(confirmed)


async def test_a_lock_another_process_holds_on_the_outbox_is_waited_for_off_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    outbox = OutboxPublisher(path)
    await outbox.publish("t", b"first", {})
    shipper = os.open(path, os.O_RDWR)
    fcntl.flock(shipper, fcntl.LOCK_EX)  # a shipper reading the file
    # If the publish waited for the lock on the loop, nothing here would run again until this
    # safety valve let go of the lock: it records that it had to.
    valve_opened = threading.Event()
    released = threading.Event()

    def valve() -> None:
        if not released.wait(5):
            valve_opened.set()
            fcntl.flock(shipper, fcntl.LOCK_UN)

    threading.Thread(target=valve, daemon=True).start()
    try:
        publishing = asyncio.ensure_future(outbox.publish("t", b"second", {}))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not publishing.done(), "the publish cannot have appended under the shipper's lock"
        assert await outbox.ping() is None  # /readyz answers meanwhile
        fcntl.flock(shipper, fcntl.LOCK_UN)
        released.set()
        await publishing
    finally:
        released.set()
        os.close(shipper)
        await outbox.close()
    assert not valve_opened.is_set(), "the publish held the event loop while another process held the lock"
    assert [m["data"] for m in read_outbox(path).messages] == ["Zmlyc3Q=", "c2Vjb25k"]  # first, second
