"""The tierstore version: reported by --version, the start-up banner and the
admin API's OpenAPI info."""

from __future__ import annotations

from importlib import metadata


def _package_version() -> str:
    try:
        return metadata.version("tierstore")
    except metadata.PackageNotFoundError:
        # Running from a source tree that was never pip-installed.
        return "0.1.0"


VERSION = _package_version()
