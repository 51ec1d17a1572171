"""Fixtures for the emulator tests (the BigQuery emulator lives in tests/support/bqemu.py)."""

from tests.support.bqemu import bq_emulator

__all__ = ["bq_emulator"]
