"""Fixtures shared by the unit tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.oidc import LocalGoogleCerts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def quick_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The README's quick start: examples/filter.yaml, every file in the working directory."""
    shutil.copy(ROOT / "examples" / "filter.yaml", tmp_path / "filter.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PUBSUB_FILTER_CONFIG", raising=False)
    return tmp_path / "filter.yaml"


@pytest.fixture
def certs() -> Iterator[LocalGoogleCerts]:
    """Google's certificate endpoint, served locally, signing the push tokens a test makes."""
    with LocalGoogleCerts() as served:
        yield served
