"""pyproject.toml in the form current setuptools reads without deprecation warnings."""

from __future__ import annotations

import warnings
from pathlib import Path

from setuptools.config.pyprojecttoml import read_configuration

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_pyproject_reads_without_deprecation_warnings_and_names_the_license_in_spdx() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # setuptools warns about the `license = {text = ...}` table form
        project = read_configuration(PYPROJECT)["project"]
    assert project["license"] == "Apache-2.0"
