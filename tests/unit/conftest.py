"""Fixtures shared by the unit tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def quick_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The README's quick start: examples/filter.yaml, every file in the working directory."""
    shutil.copy(ROOT / "examples" / "filter.yaml", tmp_path / "filter.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PUBSUB_FILTER_CONFIG", raising=False)
    return tmp_path / "filter.yaml"
