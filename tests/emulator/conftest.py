"""Fixtures for the emulator tests (the BigQuery emulator lives in tests/support/bqemu.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.bqemu import bq_emulator
from tests.support.dlq import DeadLetterRig
from tests.support.emulators import PubsubEmulator
from tests.support.pubsub_helpers import PubsubAdmin

__all__ = ["bq_emulator"]


@pytest.fixture
def admin(pubsub_emulator: PubsubEmulator) -> Iterator[PubsubAdmin]:
    """Topics and subscriptions on the Pub/Sub emulator, deleted after the test."""
    a = PubsubAdmin(pubsub_emulator)
    yield a
    a.cleanup()


@pytest.fixture
def rig(admin: PubsubAdmin) -> Iterator[DeadLetterRig]:
    """A source topic, its subscription and a dead-letter topic with its own, deleted after the test."""
    r = DeadLetterRig.create(admin)
    yield r
    r.cleanup()
