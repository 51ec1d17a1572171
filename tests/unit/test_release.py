"""Released like a library: a license, one version that every artifact says, a changelog.

The version is written once (filter/pubsub_filter/_version.py). The wheel's metadata reads it through
setuptools' dynamic version, `pubsub-filter --version` prints it, and the image's
`org.opencontainers.image.version` label is the build argument that `make image` and
infra/cloudbuild.yaml read from the same file, which the Dockerfile refuses to differ from what
the installed wheel says. tests/selfcheck/test_image_install.py builds the wheel and checks its
metadata and console script against the same version.
"""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

import pytest
import yaml
from setuptools.config.pyprojecttoml import read_configuration

import pubsub_filter
from pubsub_filter._version import __version__
from pubsub_filter.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _joined(path: Path) -> str:
    """A Dockerfile or Makefile with its continuation lines joined."""
    return path.read_text(encoding="utf-8").replace("\\\n", " ")


def test_the_version_is_written_in_one_place_and_the_package_metadata_reads_it_from_there() -> None:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    assert "version" not in project and project["dynamic"] == ["version"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolved = read_configuration(ROOT / "pyproject.toml")["project"]["version"]
    assert resolved == __version__ == pubsub_filter.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", __version__), __version__
    written = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "filter" / "pubsub_filter").rglob("*.py")
        if re.search(r"^__version__\s*=", p.read_text(encoding="utf-8"), re.MULTILINE)
    ]
    assert written == ["filter/pubsub_filter/_version.py"]


def test_the_command_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"pubsub-filter {__version__}\n"


def test_the_image_label_is_the_version_the_build_passes_and_the_build_refuses_another() -> None:
    dockerfile = _joined(ROOT / "Dockerfile")
    stages = re.split(r"^FROM ", dockerfile, flags=re.MULTILINE)[1:]
    assert len(stages) == 2
    builder, final = stages
    assert re.search(r"^ARG VERSION$", builder, re.MULTILINE) and re.search(r"^ARG VERSION$", final, re.MULTILINE)
    assert 'org.opencontainers.image.version="${VERSION}"' in final
    # the builder compares the installed wheel's own answer with the argument, and fails on a difference
    check = re.search(r'built="\$\(/opt/venv/bin/pubsub-filter --version\)".*?exit 1', builder, re.DOTALL)
    assert check and '"pubsub-filter ${VERSION}"' in check.group(0), builder


def test_make_image_and_cloud_build_pass_the_version_from_the_one_place_it_is_written() -> None:
    makefile = _joined(ROOT / "Makefile")
    assert re.search(r"^VERSION\s*:= \$\(shell sed .*filter/pubsub_filter/_version\.py\)$", makefile, re.MULTILINE)
    (image,) = re.findall(r"^image:.*\n\t(.*)$", makefile, re.MULTILINE)
    assert "--build-arg VERSION=$(VERSION)" in image
    build = yaml.safe_load((ROOT / "infra" / "cloudbuild.yaml").read_text(encoding="utf-8"))
    steps = {step["id"]: step for step in build["steps"]}
    assert 'runpy.run_path("filter/pubsub_filter/_version.py")["__version__"]' in steps["version"]["args"][-1]
    assert "/workspace/VERSION" in steps["version"]["args"][-1]
    assert '--build-arg VERSION="$$(cat /workspace/VERSION)"' in steps["build"]["args"][-1]
    assert "RepoDigests" in steps["push"]["args"][-1], "the build prints the digest to deploy"


def test_the_license_is_the_apache_2_text_and_ships_in_the_distributions() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 10_000
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "!LICENSE" in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()


def test_the_changelog_has_an_unreleased_section_and_one_for_the_current_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", changelog, re.MULTILINE)
    names = [name for name, _ in sections]
    assert names[0] == "Unreleased"
    assert __version__ in names, f"CHANGELOG.md has no section for {__version__}"
    assert all(date for name, date in sections if name != "Unreleased"), "a released section has its date"


def test_the_release_tools_are_an_extra_of_their_own_and_not_runtime_dependencies() -> None:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    release = {re.split(r"[<>=!~ \[]", r, maxsplit=1)[0] for r in project["optional-dependencies"]["release"]}
    assert release == {"build", "twine"}
    runtime = {re.split(r"[<>=!~ \[]", r, maxsplit=1)[0] for r in project["dependencies"]}
    assert not release & runtime
