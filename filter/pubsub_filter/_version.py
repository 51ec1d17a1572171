"""The package's version, in one place: pyproject.toml reads it (setuptools' dynamic version), so the
wheel, `pubsub-filter --version` and the image's `org.opencontainers.image.version` label agree
(tests/unit/test_release.py). Bump it with a CHANGELOG.md section of the same number."""

__version__ = "0.1.0"
